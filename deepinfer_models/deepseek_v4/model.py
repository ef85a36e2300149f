"""DeepSeek-V4 for causal LM, written for the engine: flattened tokens of many requests,
positions and per-step paged-cache metadata in, hidden states out. Device-free: every
numeric op is a registry kernel resolved once at construction.
"""
from __future__ import annotations

import torch

from deepinfer_core.kernels.ops.rope import default_inv_freq, yarn_inv_freq
from deepinfer_core.kernels.resolve import resolve_kernels
from deepinfer_core.kv.spec import KVCacheSpec
from deepinfer_core.runner.context import StepContext
from deepinfer_models.deepseek_v4.attention import AttentionV4
from deepinfer_models.deepseek_v4.config import DeepseekV4Config
from deepinfer_models.deepseek_v4.moe import MoEV4
from deepinfer_models.layers.linear import Linear
from deepinfer_models.layers.static_index import use_kernels

KERNEL_OPS = (
    "norm.rms", "norm.rms_unweighted", "norm.rms_rope", "rope.interleaved", "attention.sparse_sink",
    "attention.sparse_sink_rope", "compress.softmax_pool",
    "index.scores", "index.topk", "index.entry_slots", "mhc.mix", "mhc.collapse", "mhc.expand", "mhc.head_pre", "mhc.pre_norm",
    "mhc.expand_pre_norm", "moe.route_topk", "moe.router_topk", "moe.clamped_swiglu",
    "moe.route_hash", "moe.experts", "moe.experts_fp8", "moe.experts_mxfp4", "moe.experts_mxfp4_layout",
    "moe.topk_experts_mxfp4",
    "gemm.dense", "gemm.dense_wide",
    "gemm.fp8_block", "gemm.mxfp4",
    "gemm.fp8_block_grouped", "cache.write_rows", "stream.side",
)


def rope_tables(cfg, device: torch.device) -> dict[str, torch.Tensor]:
    """inv_freq for the main rope (ratio-0 layers) and the compress rope (YaRN, no magnitude scale)."""
    rd = cfg.qk_rope_head_dim
    main = default_inv_freq(rd, cfg.rope_theta)
    rs = cfg.rope_scaling or {}
    if rs.get("type", rs.get("rope_type")) == "yarn":
        comp = yarn_inv_freq(rd, cfg.compress_rope_theta, float(rs["factor"]),
                             int(rs.get("original_max_position_embeddings", cfg.max_position_embeddings)),
                             float(rs.get("beta_fast", 32) or 32), float(rs.get("beta_slow", 1) or 1))
    else:
        comp = default_inv_freq(rd, cfg.compress_rope_theta)
    return {"main": main.to(device), "compress": comp.to(device)}


def make_linear_factory(weights: dict, cfg, kernels: dict, dtype: torch.dtype):
    """``make_linear(name)`` builds a Linear from ``name.weight`` (+ ``name.scale``) in checkpoint layout."""
    block = tuple(cfg.quant.weight_block_size)

    def make_linear(name: str) -> Linear:
        weight = weights[f"{name}.weight"]
        scale = weights.get(f"{name}.scale")
        if scale is None:
            fmt = "dense"
        elif weight.dtype == torch.float8_e4m3fn:
            fmt = "fp8"
        elif weight.dtype in (torch.uint8, torch.int8):
            fmt = "mxfp4"
        else:
            raise ValueError(f"{name}.weight has dtype {weight.dtype} with a .scale; expected float8_e4m3fn or packed uint8")
        return Linear(name, weight, scale, fmt, block, kernels, dtype)

    return make_linear


class DeepseekCausalLMBase:
    """What every DeepSeek-V4.x causal LM sets up: resolved kernels, checkpoint-layout linears,
    rope tables, embedding, head and final norm, and the logits projection."""

    kernel_ops: tuple[str, ...] = ()

    def _setup(self, cfg, weights: dict[str, torch.Tensor], dtype: torch.dtype, device, platform,
               kernel_overrides: dict | None) -> tuple:
        """Returns ``(make_linear, rope)`` for the layers."""
        self.cfg, self.dtype = cfg, dtype
        self.device = torch.device(device)
        self.k = resolve_kernels(self.kernel_ops, platform, kernel_overrides)
        use_kernels(self.k)  # static_index.write_rows (every cache write) runs this model's cache.write_rows
        self.embed = weights["embed.weight"].to(dtype)
        self.head = weights["head.weight"].to(dtype)
        self.norm_w = weights["norm.weight"].float()
        return make_linear_factory(weights, cfg, self.k, dtype), rope_tables(cfg, self.device)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, D] -> fp32 logits [N, V]."""
        return self.k["gemm.dense"](hidden, self.head).float()


class DeepseekV4ForCausalLM(DeepseekCausalLMBase):
    """The model. ``weights`` maps native checkpoint names to tensors already on ``device``.

    ``dtype`` is the activation dtype (bf16 in serving, fp32 in tests); bf16 checkpoint
    tensors are cast to it, fp32 ones (mHC, sinks, biases, norms) stay fp32.
    """

    kernel_ops = KERNEL_OPS

    def __init__(self, cfg: DeepseekV4Config, weights: dict[str, torch.Tensor], dtype: torch.dtype = torch.bfloat16,
                 device: torch.device | str = "cpu", platform=None, kernel_overrides: dict | None = None,
                 block_size: int = 64, cache_dtype: torch.dtype | None = None):
        make_linear, rope = self._setup(cfg, weights, dtype, device, platform, kernel_overrides)
        cache_dtype = cache_dtype or dtype
        self.hc_head = (weights["hc_head_fn"].float(), weights["hc_head_base"].float(), weights["hc_head_scale"].float())
        self.layers = []
        for i in range(cfg.num_hidden_layers):
            hc = {}
            for sub in ("attn", "ffn"):
                hc[sub] = tuple(weights[f"layers.{i}.hc_{sub}_{n}"].float() for n in ("fn", "base", "scale"))
            self.layers.append({
                "attn_norm": weights[f"layers.{i}.attn_norm.weight"].float(),
                "ffn_norm": weights[f"layers.{i}.ffn_norm.weight"].float(),
                "hc": hc,
                "attn": AttentionV4(cfg, i, weights, make_linear, rope, self.k, block_size, cache_dtype),
                "ffn": MoEV4(cfg, i, weights, make_linear, self.k, dtype),
            })

    # -- cache declaration ---------------------------------------------------
    def kv_cache_specs(self) -> dict[str, KVCacheSpec]:
        """Every cache tensor the model needs, by name (paged groups and per-request state)."""
        out: dict[str, KVCacheSpec] = {}
        for layer in self.layers:
            out.update(layer["attn"].specs())
        return out

    def prefix_replay_tokens(self) -> int:
        """Tokens before a prefix-cache hit boundary to recompute so that compressor state is exact.

        Hits are aligned to every cache group's block size, hence to every compress ratio:
        an HCA window never straddles the boundary, a CSA (overlapping) compressor still
        needs the a-halves of the last window before it: ``ratio`` tokens.
        """
        return max((4 for layer in self.layers if layer["attn"].ratio == 4), default=0)

    # -- forward -------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """input_ids [T] int64 -> final hidden states [T, D] in ``dtype`` (after the last norm).

        Each sublayer boundary is one fused op: the previous sublayer's expand into the streams, the next
        one's mix, collapse and input norm (``mhc.expand_pre_norm``; the first is ``mhc.pre_norm``).
        """
        k, cfg = self.k, self.cfg
        hc_args = (cfg.rms_norm_eps, cfg.hc_eps, cfg.hc_sinkhorn_iters)
        x = self.embed[input_ids]
        residual = x.unsqueeze(1).expand(-1, cfg.hc_mult, -1).contiguous()  # [T, n, D]
        if self.layers:
            first = self.layers[0]
            h, _pre, post, comb = k["mhc.pre_norm"](residual, *first["hc"]["attn"], first["attn_norm"], *hc_args)
        for i, layer in enumerate(self.layers):
            residual, h, _pre, post, comb = k["mhc.expand_pre_norm"](
                residual, layer["attn"](h, ctx), post, comb, *layer["hc"]["ffn"], layer["ffn_norm"], *hc_args)
            y = layer["ffn"].parts(h, input_ids)  # (routed, shared): mhc.expand sums them
            if i + 1 < len(self.layers):
                nxt = self.layers[i + 1]
                residual, h, _pre, post, comb = k["mhc.expand_pre_norm"](
                    residual, y, post, comb, *nxt["hc"]["attn"], nxt["attn_norm"], *hc_args)
            else:
                residual = k["mhc.expand"](residual, y, post, comb)
        pre = k["mhc.head_pre"](residual, *self.hc_head, cfg.rms_norm_eps, cfg.hc_eps)
        return k["norm.rms"](k["mhc.collapse"](residual, pre), self.norm_w, cfg.rms_norm_eps)
