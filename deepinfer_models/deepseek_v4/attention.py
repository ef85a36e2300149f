"""DeepSeek-V4 attention: shared-KV MQA with sinks over a sliding window plus
compressed entries (CSA: indexer top-k, HCA: all visible), grouped output projection.
"""
from __future__ import annotations

import torch

from deepinfer_core.kv.spec import SlidingWindowSpec
from deepinfer_core.runner.context import StepContext
from deepinfer_models.deepseek_v4.compressor import Compressor
from deepinfer_models.deepseek_v4.config import DeepseekV4Config
from deepinfer_models.layers import linear as _linear
from deepinfer_models.layers.linear import Linear, LinearGroup
from deepinfer_models.layers.static_index import write_rows



def split_grouped_linear(wo_a: Linear, groups: int, device) -> list:
    """The grouped output projection as one Linear per head group (rows ``g*o_lora .. (g+1)*o_lora``).

    FP8 weights whose block rows align with the groups are sliced in their native layout (weight
    rows and scale rows); otherwise the weight is dequantised once here, never per forward.
    """
    n = wo_a.out_features // groups
    if wo_a.fmt == "fp8" and n % wo_a.block[0] == 0:
        sb = n // wo_a.block[0]
        return [Linear(f"{wo_a.name}[{g}]", wo_a.weight[g * n:(g + 1) * n], wo_a.scale[g * sb:(g + 1) * sb], "fp8",
                       wo_a.block, {"gemm.fp8_block": wo_a._fn}, None) for g in range(groups)]
    dense = wo_a.dequantized(wo_a.compute_dtype)
    return [Linear(f"{wo_a.name}[{g}]", dense[g * n:(g + 1) * n], None, "dense", None,
                   {"gemm.dense": wo_a.dense_fn}, wo_a.compute_dtype) for g in range(groups)]


class GroupedOutput:
    """The grouped output projection ``wo_a``: o [T, G*Kg] (head group g in columns g*Kg ..) -> [T, G*Ng].

    FP8 weights whose block rows align with the groups go through ``gemm.fp8_block_grouped`` in their
    checkpoint layout: one kernel for all groups instead of G GEMMs and a concatenation (on the measured GPU each
    of those is a launch of its own inside a decode graph). Otherwise one Linear per group, concatenated."""

    def __init__(self, wo_a: Linear, groups: int, kernels: dict, device):
        self.groups = groups
        n = wo_a.out_features // groups
        self.fused = kernels.get("gemm.fp8_block_grouped") if wo_a.fmt == "fp8" and n % wo_a.block[0] == 0 else None
        self.wo_a = wo_a
        self.per_group = None if self.fused is not None else split_grouped_linear(wo_a, groups, device)

    def __call__(self, o: torch.Tensor) -> torch.Tensor:
        if self.fused is not None:
            return self.fused(o, self.wo_a.weight, self.wo_a.scale, self.wo_a.block, self.groups)
        og = o.reshape(o.shape[0], self.groups, -1)
        return torch.cat([lin(og[:, i]) for i, lin in enumerate(self.per_group)], dim=-1)


class Indexer:
    """Lightning indexer of a CSA layer: its own overlapping compressor (d_c = index_head_dim)
    writes index keys; queries ``wq_b(qr)`` score visible keys; top-k entry numbers are returned.
    """

    def __init__(self, cfg: DeepseekV4Config, prefix: str, w: dict, make_linear, inv_freq: torch.Tensor,
                 kernels: dict, block_size: int, cache_dtype: torch.dtype):
        self.cfg, self.k = cfg, kernels
        self.n_heads, self.head_dim = cfg.index_n_heads, cfg.index_head_dim
        self.wq_b = make_linear(f"{prefix}.wq_b")
        self.weights_proj = make_linear(f"{prefix}.weights_proj")
        self.inv_freq = inv_freq
        self.compressor = Compressor(f"{prefix}.compressor", w, 4, self.head_dim, True, inv_freq, cfg.rms_norm_eps,
                                     kernels, f"{prefix}.keys", block_size, cache_dtype)

    def specs(self) -> dict:
        return self.compressor.specs()

    def __call__(self, x: torch.Tensor, qr: torch.Tensor, ctx: StepContext,
                 q_b: torch.Tensor | None = None) -> torch.Tensor:
        """Returns entry numbers [T, k] (-1 padded) selected for each query token. ``q_b``: ``wq_b(qr)`` when the
        caller has it (the attention's merged product)."""
        self.compressor(x, ctx)
        t = x.shape[0]
        q = (self.wq_b(qr) if q_b is None else q_b).view(t, self.n_heads, self.head_dim)
        q = self.k["rope.interleaved"](q, ctx.positions, self.inv_freq)
        weights = self.weights_proj(x)  # [T, Hi]; its n_heads^-0.5 rides in score_scale (no launches here)
        cand = ctx.meta(self.compressor.cache_name).read_idx  # [T, N] in entry order
        scores = self.k["index.scores"](q, weights, ctx.caches[self.compressor.cache_name], cand,
                                        self.head_dim ** -0.5 * self.n_heads ** -0.5)
        return self.k["index.topk"](scores, self.cfg.index_topk)


class SharedKVAttention:
    """What every DeepSeek-V4.x attention layer has: the low-rank query, the shared K=V projection
    written to the layer's sliding-window cache, per-head sinks and the grouped output projection.
    Subclasses add the compressed branch (V4: CSA/HCA; V4.1: kv/index sources)."""

    def __init__(self, cfg, layer: int, w: dict, make_linear, rope: dict, kernels: dict, block_size: int,
                 cache_dtype: torch.dtype, merge_projections: bool | None = None):
        """``merge_projections``: wq_a and wkv (both read the normed x) as one product where their layouts allow
        (``LinearGroup``; default ``layers.linear.MERGE_PROJECTIONS``)."""
        p = f"layers.{layer}.attn"
        self.cfg, self.k, self.layer = cfg, kernels, layer
        self.ratio = cfg.ratio(layer)
        self.inv_freq = rope["compress" if self.ratio else "main"]
        self.h, self.d = cfg.num_attention_heads, cfg.head_dim
        self.eps = cfg.rms_norm_eps
        self.merge = _linear.MERGE_PROJECTIONS if merge_projections is None else merge_projections
        self.qkv_a = LinearGroup([make_linear(f"{p}.wq_a"), make_linear(f"{p}.wkv")], self.merge)
        self.wq_a, self.wkv = self.qkv_a.part(0), self.qkv_a.part(1)  # each alone (replay, DSpark context KV)
        self.wq_b, self.wo_b = make_linear(f"{p}.wq_b"), make_linear(f"{p}.wo_b")
        # wo_a is applied per head group (kept in the checkpoint layout)
        self.wo_a = GroupedOutput(make_linear(f"{p}.wo_a"), cfg.o_groups, kernels, w[f"{p}.wo_a.weight"].device)
        self.q_norm = w[f"{p}.q_norm.weight"].float()
        self.kv_norm = w[f"{p}.kv_norm.weight"].float()
        self.sinks = w[f"{p}.attn_sink"].float()
        self.swa_name = f"{p}.swa"
        self.swa_spec = SlidingWindowSpec(entry_shape=(self.d,), dtype=cache_dtype, window=cfg.sliding_window,
                                          block_size=block_size)


class AttentionV4(SharedKVAttention):
    def __init__(self, cfg: DeepseekV4Config, layer: int, w: dict, make_linear, rope: dict, kernels: dict,
                 block_size: int, cache_dtype: torch.dtype):
        super().__init__(cfg, layer, w, make_linear, rope, kernels, block_size, cache_dtype)
        p = f"layers.{layer}.attn"
        self.compressor = None
        self.indexer = None
        if self.ratio:
            self.compressor = Compressor(f"{p}.compressor", w, self.ratio, self.d, self.ratio == 4, self.inv_freq,
                                         self.eps, kernels, f"{p}.cmp", block_size, cache_dtype)
        if self.ratio == 4:
            self.indexer = Indexer(cfg, f"{p}.indexer", w, make_linear, self.inv_freq, kernels, block_size, cache_dtype)
        # wq_b with the indexer's wq_b (both read qr) on CSA layers; wq_b alone elsewhere
        self.q_b = LinearGroup([self.wq_b] + ([self.indexer.wq_b] if self.indexer is not None else []), self.merge)

    def specs(self) -> dict:
        out = {self.swa_name: self.swa_spec}
        if self.compressor:
            out.update(self.compressor.specs())
        if self.indexer:
            out.update(self.indexer.specs())
        return out

    def __call__(self, x: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """x [T, D] (normed attention input) -> [T, D]."""
        t = x.shape[0]
        pos = ctx.positions
        q_a, kv_a = self.qkv_a(x)
        qr = self.k["norm.rms"](q_a, self.q_norm, self.eps)
        q, *q_index = self.q_b(qr)
        q = self.k["norm.rms_unweighted"](q.view(t, self.h, self.d), self.eps)  # V4: per-head weightless q norm
        kv = self.k["norm.rms_rope"](kv_a, self.kv_norm, self.eps, pos, self.inv_freq)
        swa = ctx.caches[self.swa_name]
        swa_meta = ctx.meta(self.swa_name)
        w = swa_meta.write_slots
        write_rows(swa, w, kv)  # -1: no write (a position served from the prefix cache)
        cmp_cache, cmp_idx = None, None
        if self.compressor is not None:
            self.compressor(x, ctx)
            cmp_cache = ctx.caches[self.compressor.cache_name]
            visible = ctx.meta(self.compressor.cache_name).read_idx  # [T, N] rows in entry order
            if self.indexer is not None:
                sel = self.indexer(x, qr, ctx, q_index[0])  # entry numbers, -1 padded
                cmp_idx = self.k["index.entry_slots"](visible, sel)
            else:
                cmp_idx = visible
        # rope(q), the attention, the inverse rope of the output: one fused op
        o = self.k["attention.sparse_sink_rope"](q, swa, swa_meta.read_idx, cmp_cache, cmp_idx, self.sinks,
                                                 self.d ** -0.5, pos, self.inv_freq)
        return self.wo_b(self.wo_a(o.reshape(t, -1)))
