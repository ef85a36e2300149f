"""DeepSeek-V4.1 for causal LM, written for the engine: the flattened tokens of many requests,
their positions and the step's paged-cache metadata in, final hidden states out.

Device-free: every numeric op is a registry kernel resolved once here. Reused from V4:
the linear layers (``make_linear_factory``), the rope tables and the MoE (V4.1 routes every
layer with the biased top-k, so ``MoEV4`` runs unchanged).
"""
from __future__ import annotations

import os

import torch

from deepinfer_core.kv.spec import KVCacheSpec
from deepinfer_core.runner.context import StepContext
from deepinfer_models.deepseek_v4.model import KERNEL_OPS as V4_KERNEL_OPS
from deepinfer_models.deepseek_v4.model import DeepseekCausalLMBase
from deepinfer_models.deepseek_v4.moe import MoEV4
from deepinfer_models.deepseek_v41.attention import AttentionV41
from deepinfer_models.deepseek_v41.config import DeepseekV41Config
from deepinfer_models.deepseek_v41.decoder_replay import plan_replay, replay_cut
from deepinfer_models.deepseek_v41.engram import EngramHasher, EngramLayer
from deepinfer_models.deepseek_v41.hyper import HCLayer, run_delayed_mhc
from deepinfer_models.deepseek_v41.step import IndexShare, StepRows

# Each Engram layer's table lookup and ``wkv`` projection (they read only the token ids) as a ``stream.side`` branch
# from the step's start, joined where the layer injects: on a platform with side streams the lookup leaves the
# layers' chain. ``DEEPINFER_ENGRAM_BRANCH=0``: in order, at the layer (docs/performance.md, thirty-sixth pass).
ENGRAM_BRANCH = os.environ.get("DEEPINFER_ENGRAM_BRANCH", "1") == "1"

_OWN_OPS = (
    "norm.rms", "norm.rms_unweighted", "norm.rms_rope", "rope.interleaved", "attention.sparse_sink",
    "attention.sparse_sink_rope", "compress.softmax_pool", "compress.ring_pair_pool", "compress.entry_write",
    "index.scores", "index.topk", "index.entry_slots", "index.candidate_blocks", "index.candidate_mask", "mhc.mix",
    "mhc.collapse", "mhc.collapse_norm",
    "mhc.expand", "mhc.pre_norm", "mhc.expand_pre_norm", "gemm.dense", "gemm.dense_wide", "gemm.fp8_block", "gemm.mxfp4", "engram.window", "engram.hash_ids", "engram.gather",
    "engram.gate",
    "gemm.fp8_block_grouped", "cache.write_rows", "stream.side",
)
# The MoE is V4's: take whatever routing / expert ops it uses from V4's list.
KERNEL_OPS = _OWN_OPS + tuple(op for op in V4_KERNEL_OPS if op.startswith("moe.") and op not in _OWN_OPS)


class DeepseekV41ForCausalLM(DeepseekCausalLMBase):
    """The model. ``weights`` maps native checkpoint names to tensors (on ``device``, except
    Engram tables that the loader may leave memory-mapped in host memory).

    ``dtype`` is the activation dtype (bf16 in serving, fp32 in tests). ``token_map`` (int64
    [vocab]) is the Engram token id -> compressed id map built from the checkpoint's
    tokenizer; required iff the config has Engram layers.
    """

    kernel_ops = KERNEL_OPS

    def __init__(self, cfg: DeepseekV41Config, weights: dict[str, torch.Tensor], dtype: torch.dtype = torch.bfloat16,
                 device: torch.device | str = "cpu", platform=None, kernel_overrides: dict | None = None,
                 block_size: int = 64, cache_dtype: torch.dtype | None = None, token_map: torch.Tensor | None = None):
        make_linear, rope = self._setup(cfg, weights, dtype, device, platform, kernel_overrides)
        cache_dtype = cache_dtype or dtype
        self.hasher = None
        if cfg.engram_layer_ids:
            if token_map is None:
                raise ValueError("this V4.1 config has Engram layers "
                                 f"{list(cfg.engram_layer_ids)}: pass token_map (built from the checkpoint tokenizer)")
            self.hasher = EngramHasher(cfg, token_map, self.k, self.device)
        self.replay_cut: int | None = None  # decoder-side replay's cut layer when on (set_decoder_replay)
        self.replay_rows = [0, 0]  # rows of the steps it planned: total, computed after the cut
        self.layers = []
        for i in range(cfg.num_hidden_layers):
            self.layers.append({
                "attn_norm": weights[f"layers.{i}.attn_norm.weight"].float(),
                "ffn_norm": weights[f"layers.{i}.ffn_norm.weight"].float(),
                "hc": {sub: tuple(weights[f"layers.{i}.hc_{sub}_{n}"].float() for n in ("fn", "base", "scale"))
                       for sub in ("attn", "ffn")},
                "attn": AttentionV41(cfg, i, weights, make_linear, rope, self.k, block_size, cache_dtype),
                "ffn": MoEV4(cfg, i, weights, make_linear, self.k, dtype),
                "engram": EngramLayer(cfg, i, weights, make_linear, self.k) if cfg.is_engram_layer(i) else None,
            })

    # -- cache declaration ---------------------------------------------------------------
    def kv_cache_specs(self) -> dict[str, KVCacheSpec]:
        """Every cache the model needs, by name: SWA on every layer, compressed entries (and index
        keys, ratio-2 ring) on kv sources only, the Engram token history per request."""
        out: dict[str, KVCacheSpec] = {}
        for layer in self.layers:
            out.update(layer["attn"].specs())
        if self.hasher is not None:
            out.update(self.hasher.specs())
        return out

    def prefix_replay_tokens(self) -> int:
        """Tokens before a prefix-cache hit to recompute so that per-request state is exact.

        Hits are aligned to every group's block size, so a ratio-2 pair never straddles the hit
        and the compressor ring needs nothing. The Engram history needs the N-1 ids before the
        hit, and the last replayed token (whose logits are sampled when the hit covers the whole
        sequence) needs its own N-1 predecessors inside the step: N tokens.
        """
        return self.cfg.engram_max_ngram_size if self.hasher is not None else 0

    def prefix_history_tokens(self) -> int:
        """Bounded prefix replay: tokens to feed before the replayed window only so that per-request
        token history is exact (the Engram n-gram history: N-1 ids)."""
        return self.cfg.engram_max_ngram_size - 1 if self.hasher is not None else 0

    def set_decoder_replay(self, on: bool) -> None:
        """Turn decoder-side replay on or off (``decoder_replay.py``); stays off where the topology
        does not allow it. ``forward_with_taps`` (speculative decoding) never trims."""
        self.replay_cut = replay_cut(self.cfg) if on else None

    def load_proposer(self, model_dir, spec, platform=None, kernel_overrides=None):
        """The speculative proposer for ``spec`` (a SpeculativeConfig): DSpark, from the
        checkpoint's ``mtp.*`` stages (dspark_proposer.py)."""
        from deepinfer_models.deepseek_v41.dspark_proposer import load_dspark_proposer

        if spec.method != "dspark":
            raise ValueError(f"speculative_config: DeepSeek-V4.1 drafts with 'dspark', not {spec.method!r}")
        return load_dspark_proposer(self, model_dir, spec, platform=platform, kernel_overrides=kernel_overrides)

    # -- forward -------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """input_ids [T] int64 -> final hidden states [T, D] in ``dtype`` (after the final norm)."""
        return self._forward(input_ids, ctx, None)

    def forward_with_taps(self, input_ids: torch.Tensor, ctx: StepContext, tap_layer_ids
                          ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """``forward`` plus, for each id in ``tap_layer_ids``, the mean over the hc streams of the
        residual entering that layer (after its Engram injection): ``{layer: [T, D]}`` in
        ``dtype``. These are the DSpark target features (docs/models/deepseek_v41_deltas.md, 3.12)."""
        taps: dict[int, torch.Tensor] = {}
        for L in tap_layer_ids:
            if not 0 <= L < self.cfg.num_hidden_layers:
                raise ValueError(f"tap layer {L} is out of range [0, {self.cfg.num_hidden_layers})")
            taps[L] = None
        return self._forward(input_ids, ctx, taps), taps

    def _forward(self, input_ids: torch.Tensor, ctx: StepContext, taps: dict | None) -> torch.Tensor:
        k, cfg = self.k, self.cfg
        rows = StepRows.from_context(ctx)
        share = IndexShare()
        hash_ids = self.hasher(input_ids, ctx, rows) if self.hasher is not None else None
        eps = cfg.rms_norm_eps
        c = self.replay_cut
        plan = plan_replay(ctx, cfg.sliding_window) if c is not None and taps is None else None
        if c is not None and taps is None:
            self.replay_rows[0] += input_ids.shape[0]
            self.replay_rows[1] += plan.num_kept if plan is not None else input_ids.shape[0]
        kept_ids = input_ids.index_select(0, plan.rows) if plan is not None else None
        # the streams first: their two small launches would otherwise queue behind the Engram branches' GEMVs
        # [T, n, D]: each token's embedding row gathered once per stream, one launch (a gather then a broadcast copy
        # was two, both on the chain)
        residual = self.embed[input_ids[:, None].expand(-1, cfg.hc_mult)]
        # every Engram layer's table lookup reads only this step's ids: branches from here, joined where they inject
        engram_ids = [i for i, layer in enumerate(self.layers) if layer["engram"] is not None and ENGRAM_BRANCH]
        lookups = {i: k["stream.side"](self.layers[i]["engram"].lookup, hash_ids, self.dtype) for i in engram_ids}
        stack = []
        for i, layer in enumerate(self.layers):
            attn, ffn, engram = layer["attn"], layer["ffn"], layer["engram"]
            inject = (lambda r, e=engram, b=lookups.get(i): e(r, hash_ids, b.join() if b is not None else None)
                      ) if engram is not None else None
            if taps is not None and i in taps:  # read-only: record the stream, return it unchanged
                inject = _tapping(inject, taps, i)
            if plan is None or i < c:
                attn_fn = lambda h, a=attn: a(h, ctx, rows, share)
            elif i == c:  # the cut: every row's KV is already written, attend on the kept rows
                attn_fn = lambda h, a=attn: a.attend(h, plan.cut_ctx, share)
            else:  # owns only window KV: kept rows, windows floored where rows were trimmed
                attn_fn = lambda h, a=attn: a(h, plan.late_ctx, None, share)
            ids = kept_ids if plan is not None and i >= c else input_ids
            stack.append(HCLayer(
                hc_attn=layer["hc"]["attn"], hc_ffn=layer["hc"]["ffn"], attn_norm=layer["attn_norm"],
                ffn_norm=layer["ffn_norm"], attn=attn_fn, ffn=lambda h, f=ffn, ids=ids: f.parts(h, ids), inject=inject,
            ))

        def keep(h: torch.Tensor) -> torch.Tensor:
            """At the cut: write every row's KV of layer c from its normed input ``h``, move what earlier index
            sources published to the kept rows, hand the kept rows to the driver."""
            self.layers[c]["attn"].write_kv(h, ctx, rows)
            for key, v in share.topk.items():
                share.topk[key] = v.index_select(0, plan.rows)
            if share.candidates is not None:
                share.candidates = share.candidates.index_select(0, plan.rows)
            return plan.rows

        h = run_delayed_mhc(residual, stack, k, eps, cfg.hc_eps, cfg.hc_sinkhorn_iters,
                            cut=(c, keep) if plan is not None else None)
        return k["norm.rms"](h, self.norm_w, eps)



def _tapping(inject, taps: dict, layer: int):
    """Wrap a layer's (optional) Engram injection so the resulting stream's hc mean is recorded."""
    def run(r: torch.Tensor) -> torch.Tensor:
        if inject is not None:
            r = inject(r)
        taps[layer] = r.mean(dim=1)
        return r
    return run
