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

from deepinfer_core.loader import TensorSpec
from deepinfer_models.deepseek_v4.config import DeepseekV4Config
from deepinfer_models.layers.tensor_table import TensorTableBuilder

# Tensor name prefixes of a native V4 checkpoint that the target model does not load (MTP draft layers).
SKIP_PREFIXES = ("mtp.",)

_Builder = TensorTableBuilder


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
    D, d, ql = cfg.hidden_size, cfg.head_dim, cfg.q_lora_rank
    b.attention_core(p)
    if ratio:
        _compressor(b, f"{p}.compressor", ratio, d, D)
    if ratio == 4:
        Hi, Di = cfg.index_n_heads, cfg.index_head_dim
        b.linear(f"{p}.indexer.wq_b", Hi * Di, ql)
        b.linear(f"{p}.indexer.weights_proj", Hi, D, kind="bf16")
        _compressor(b, f"{p}.indexer.compressor", 4, Di, D)


def _moe(b: _Builder, p: str, cfg: DeepseekV4Config, hash_layer: bool) -> None:
    D, E = cfg.hidden_size, cfg.n_routed_experts
    b.bf16(f"{p}.gate.weight", (E, D))
    if hash_layer:
        b.add(f"{p}.gate.tid2eid", (cfg.vocab_size, cfg.num_experts_per_tok), (torch.int32, torch.int64), "index")
    else:
        b.fp32(f"{p}.gate.bias", (E,))
    b.experts(p, E)


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
