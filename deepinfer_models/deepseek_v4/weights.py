"""The native DeepSeek-V4 checkpoint layout: every tensor name, shape and dtype.

``expected_tensors(cfg)`` is the single source of truth used by the loader
(validation), the tiny checkpoint writer (what to write) and the HF oracle
conversion. Names are the native ones (``layers.{i}.attn.wq_a.weight``...),
MODEL_SPEC.md section 4.1.

Roles (``TensorSpec.role``):
- ``"dense"``: a bf16 linear weight ``[N, K]``;
- ``"fp8_weight"`` / ``"fp8_scale"``: an e4m3 block-quantised linear and its
  ``[ceil(N/bn), ceil(K/bk)]`` scale (``.scale`` next to ``.weight``);
- ``"mxfp4_weight"`` / ``"mxfp4_scale"``: packed e2m1 ``[N, K/2]`` and UE8M0
  ``[N, K/32]`` (experts with ``expert_dtype == "fp4"``);
- ``"norm"``: an RMSNorm weight; ``"embed"``: embedding / head rows;
- ``"fp32"``: a float32 parameter (mHC, sinks, ape, router bias);
- ``"index"``: an integer table (hash-routing ``tid2eid``).
"""
from __future__ import annotations

import torch

from deepinfer_core.kernels.ops.quant import MXFP4_GROUP, fp8_block_scale_shape
from deepinfer_core.loader import TensorSpec
from deepinfer_models.deepseek_v4.config import DeepseekV4Config

# Tensor name prefixes of a native V4 checkpoint that the target model does not load (MTP draft layers).
SKIP_PREFIXES = ("mtp.",)

BF16 = (torch.bfloat16,)
BF16_OR_FP32 = (torch.bfloat16, torch.float32)
FP32 = (torch.float32,)


class _Builder:
    """Accumulates specs, applying the checkpoint's quantisation to linears."""

    def __init__(self, cfg: DeepseekV4Config) -> None:
        self.cfg = cfg
        self.q = cfg.quant
        self.specs: dict[str, TensorSpec] = {}
        # Unquantised checkpoints may store any bf16 tensor as fp32 too.
        self.plain = BF16 if self.q.quantized else BF16_OR_FP32

    def add(self, name: str, shape, dtypes, role: str) -> None:
        if name in self.specs:  # a layout bug, not bad input
            raise AssertionError(f"duplicate tensor name {name}")
        self.specs[name] = TensorSpec(tuple(shape), tuple(dtypes), role)

    def bf16(self, name: str, shape, role: str = "dense") -> None:
        self.add(name, shape, self.plain, role)

    def norm(self, name: str, dim: int) -> None:
        self.add(name, (dim,), BF16_OR_FP32, "norm")

    def fp32(self, name: str, shape) -> None:
        self.add(name, shape, FP32, "fp32")

    def linear(self, prefix: str, n: int, k: int, kind: str = "dense") -> None:
        """``prefix.weight [n, k]`` (+ ``prefix.scale``) per the quant config.

        ``kind``: ``"dense"`` (fp8 when quantised), ``"expert"`` (fp8 or MXFP4 per
        ``expert_dtype``) or ``"bf16"`` (never quantised).
        """
        fmt = None
        if self.q.quantized and kind != "bf16":
            fmt = "mxfp4" if kind == "expert" and self.q.expert_dtype == "fp4" else "fp8"
        if fmt is None:
            self.bf16(f"{prefix}.weight", (n, k))
        elif fmt == "fp8":
            scale_dtype = torch.float8_e8m0fnu if self.q.scale_fmt == "ue8m0" else torch.float32
            self.add(f"{prefix}.weight", (n, k), (torch.float8_e4m3fn,), "fp8_weight")
            self.add(f"{prefix}.scale", fp8_block_scale_shape(n, k, tuple(self.q.weight_block_size)),
                     (scale_dtype,), "fp8_scale")
        else:
            if k % MXFP4_GROUP:
                raise ValueError(f"{prefix}: MXFP4 experts need the input dim ({k}) divisible by {MXFP4_GROUP}")
            self.add(f"{prefix}.weight", (n, k // 2), (torch.uint8, torch.int8), "mxfp4_weight")
            self.add(f"{prefix}.scale", (n, k // MXFP4_GROUP), (torch.float8_e8m0fnu,), "mxfp4_scale")


def _hc(b: _Builder, prefix: str, rows: int, n: int, d: int, n_scale: int) -> None:
    b.fp32(f"{prefix}_fn", (rows, n * d))
    b.fp32(f"{prefix}_base", (rows,))
    b.fp32(f"{prefix}_scale", (n_scale,))


def _compressor(b: _Builder, prefix: str, ratio: int, dim: int, d_model: int) -> None:
    """A V4 compressor: ratio 4 overlaps two windows (width 2*dim), ratio 128 does not."""
    width = 2 * dim if ratio == 4 else dim
    b.linear(f"{prefix}.wkv", width, d_model, kind="bf16")
    b.linear(f"{prefix}.wgate", width, d_model, kind="bf16")
    b.fp32(f"{prefix}.ape", (ratio, width))
    b.norm(f"{prefix}.norm.weight", dim)


def _attention(b: _Builder, p: str, cfg: DeepseekV4Config, ratio: int) -> None:
    D, H, d = cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim
    G, ql = cfg.o_groups, cfg.q_lora_rank
    b.linear(f"{p}.wq_a", ql, D)
    b.norm(f"{p}.q_norm.weight", ql)
    b.linear(f"{p}.wq_b", H * d, ql)
    b.linear(f"{p}.wkv", d, D)
    b.norm(f"{p}.kv_norm.weight", d)
    b.linear(f"{p}.wo_a", G * cfg.o_lora_rank, H * d // G)
    b.linear(f"{p}.wo_b", D, G * cfg.o_lora_rank)
    b.fp32(f"{p}.attn_sink", (H,))
    if ratio:
        _compressor(b, f"{p}.compressor", ratio, d, D)
    if ratio == 4:
        Hi, Di = cfg.index_n_heads, cfg.index_head_dim
        b.linear(f"{p}.indexer.wq_b", Hi * Di, ql)
        b.linear(f"{p}.indexer.weights_proj", Hi, D, kind="bf16")
        _compressor(b, f"{p}.indexer.compressor", 4, Di, D)


def _moe(b: _Builder, p: str, cfg: DeepseekV4Config, hash_layer: bool) -> None:
    D, E, F = cfg.hidden_size, cfg.n_routed_experts, cfg.moe_intermediate_size
    b.bf16(f"{p}.gate.weight", (E, D))
    if hash_layer:
        b.add(f"{p}.gate.tid2eid", (cfg.vocab_size, cfg.num_experts_per_tok), (torch.int32, torch.int64), "index")
    else:
        b.fp32(f"{p}.gate.bias", (E,))
    for e in range(E):
        b.linear(f"{p}.experts.{e}.w1", F, D, kind="expert")
        b.linear(f"{p}.experts.{e}.w2", D, F, kind="expert")
        b.linear(f"{p}.experts.{e}.w3", F, D, kind="expert")
    Fs = F * cfg.n_shared_experts
    if Fs:
        b.linear(f"{p}.shared_experts.w1", Fs, D)
        b.linear(f"{p}.shared_experts.w2", D, Fs)
        b.linear(f"{p}.shared_experts.w3", Fs, D)


def expected_tensors(cfg: DeepseekV4Config) -> dict[str, TensorSpec]:
    """Every tensor of a native V4 checkpoint for ``cfg`` (target model only, no ``mtp.*``).

    Insertion order is stable: top level first, then layer by layer.
    """
    b = _Builder(cfg)
    D, V, n = cfg.hidden_size, cfg.vocab_size, cfg.hc_mult
    b.bf16("embed.weight", (V, D), role="embed")
    b.bf16("head.weight", (V, D), role="embed")
    b.norm("norm.weight", D)
    _hc(b, "hc_head", n, n, D, 1)
    for i in range(cfg.num_hidden_layers):
        p = f"layers.{i}"
        b.norm(f"{p}.attn_norm.weight", D)
        b.norm(f"{p}.ffn_norm.weight", D)
        _hc(b, f"{p}.hc_attn", (2 + n) * n, n, D, 3)
        _hc(b, f"{p}.hc_ffn", (2 + n) * n, n, D, 3)
        _attention(b, f"{p}.attn", cfg, cfg.ratio(i))
        _moe(b, f"{p}.ffn", cfg, cfg.is_hash_layer(i))
    return b.specs


__all__ = ["expected_tensors", "SKIP_PREFIXES"]
