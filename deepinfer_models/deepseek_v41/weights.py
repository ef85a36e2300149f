"""The native DeepSeek-V4.1 checkpoint layout: every tensor name, shape and dtype.

``expected_tensors(cfg)`` lists what the target (text) model loads, ``mtp_tensors(cfg)``
the DSpark draft stages ``mtp.{i}.*`` (validated, not used by the target model), both
as ``{name: TensorSpec}`` (MODEL_SPEC.md 4.1, docs/models/deepseek_v41.md section 2).
They are the single source of truth for the loader and the tiny checkpoint writer.

Roles (``TensorSpec.role``), as in ``deepinfer_models.deepseek_v4.weights`` plus Engram:
``dense`` (bf16 linear), ``fp8_weight`` / ``fp8_scale`` (e4m3, one UE8M0 scale per 32x32
block), ``mxfp4_weight`` / ``mxfp4_scale`` (packed e2m1 ``[N, K/2]``, UE8M0 per 32 along K),
``norm``, ``embed``, ``fp32``, ``engram_table`` / ``engram_scale`` (FP8 rows, UE8M0 per 32
values), ``engram_vec`` (the per-stream gate weights).

Vision-language checkpoints also carry tensors the text model drops: ``vision.*``,
``aligner.*``, ``image_*`` (skipped by prefix) and ``ffn.gate.bias_vl`` (shape-checked when
present, see ``optional_tensors``).
"""
from __future__ import annotations

import torch

from deepinfer_core.loader import TensorSpec
from deepinfer_models.deepseek_v41.config import DeepseekV41Config
from deepinfer_models.layers.tensor_table import BF16_OR_FP32, FP32, UE8M0, TensorTableBuilder

VISION_PREFIXES = ("vision.", "aligner.", "image_")
MTP_PREFIX = "mtp."

_Builder = TensorTableBuilder


def _attention(b: _Builder, p: str, cfg: DeepseekV41Config, layer: int | None) -> None:
    """``layer`` None: a draft (DSpark) layer, pure sliding window."""
    D, d, ql = cfg.hidden_size, cfg.head_dim, cfg.q_lora_rank
    b.attention_core(p)
    if layer is None:
        return
    if cfg.is_kv_source(layer):
        b.linear(f"{p}.compressor.wkv", d, D, kind="bf16")
        if cfg.ratio(layer) == 2:
            b.linear(f"{p}.compressor.wgate", d, D, kind="bf16")
        b.norm(f"{p}.compressor.norm.weight", d)
    if cfg.is_index_source(layer):
        Hi, Di = cfg.index_n_heads, cfg.index_head_dim
        b.linear(f"{p}.indexer.wq_b", Hi * Di, ql)
        b.linear(f"{p}.indexer.weights_proj", Hi, D, kind="bf16")
        if cfg.owns_index_keys(layer):
            b.linear(f"{p}.indexer.wk", Di, d, kind="bf16")
            b.norm(f"{p}.indexer.k_norm.weight", Di)


def _moe(b: _Builder, p: str, cfg: DeepseekV41Config, n_experts: int) -> None:
    D = cfg.hidden_size
    b.add(f"{p}.gate.weight", (n_experts, D), b.plain, "dense")
    b.fp32(f"{p}.gate.bias", (n_experts,))
    b.experts(p, n_experts)


def _engram(b: _Builder, p: str, cfg: DeepseekV41Config, rows: int) -> None:
    D, n, hd = cfg.hidden_size, cfg.hc_mult, cfg.engram_head_dim
    if b.q.quantized:
        b.add(f"{p}.embed.weight", (rows, hd), (torch.float8_e4m3fn,), "engram_table")
        b.add(f"{p}.embed.scale", (rows, hd // 32), UE8M0, "engram_scale")
    else:
        b.add(f"{p}.embed.weight", (rows, hd), b.plain, "engram_table")
    b.linear(f"{p}.wkv", (n + 1) * D, cfg.engram_n_cols * hd)
    b.add(f"{p}.q_weight", (n, D), b.plain, "engram_vec")
    b.add(f"{p}.k_weight", (n, D), b.plain, "engram_vec")


def _decoder_layer(b: _Builder, p: str, cfg: DeepseekV41Config, layer: int | None, n_experts: int) -> None:
    D = cfg.hidden_size
    b.norm(f"{p}.attn_norm.weight", D)
    b.norm(f"{p}.ffn_norm.weight", D)
    b.hc(f"{p}.hc_attn")
    b.hc(f"{p}.hc_ffn")
    _attention(b, f"{p}.attn", cfg, layer)
    _moe(b, f"{p}.ffn", cfg, n_experts)


def expected_tensors(cfg: DeepseekV41Config) -> dict[str, TensorSpec]:
    """Every tensor of the target (text) model, in a stable order: top level, then layer by layer."""
    b = _Builder(cfg, raw_scale_bytes=True)
    D, V = cfg.hidden_size, cfg.vocab_size
    b.add("embed.weight", (V, D), b.plain, "embed")
    b.add("head.weight", (V, D), b.plain, "embed")
    b.norm("norm.weight", D)
    for i in range(cfg.num_hidden_layers):
        p = f"layers.{i}"
        _decoder_layer(b, p, cfg, i, cfg.n_routed_experts)
        if cfg.is_engram_layer(i):
            _engram(b, f"{p}.engram", cfg, cfg.engram_num_embeddings[cfg.engram_layer_ids.index(i)])
    return b.specs


def mtp_layer_tensors(cfg: DeepseekV41Config) -> dict[str, TensorSpec]:
    """The decoder-block tensors of every DSpark stage ``mtp.{i}.`` (ratio-0 attention, draft MoE)."""
    b = _Builder(cfg, raw_scale_bytes=True)
    for i in range(cfg.n_mtp_layers):
        _decoder_layer(b, f"mtp.{i}", cfg, None, cfg.draft_n_routed_experts)
    return b.specs


def mtp_head_tensors(cfg: DeepseekV41Config) -> dict[str, TensorSpec]:
    """DSpark head tensors by name *without* the stage prefix (both serving stacks accept them on
    any stage): ``main_proj`` / ``main_norm`` (required), ``norm`` (required), the Markov head
    (required iff ``dspark_markov_rank > 0``) and the optional confidence head."""
    b = _Builder(cfg, raw_scale_bytes=True)
    D = cfg.hidden_size
    n_targets = len(cfg.dspark_target_layer_ids) or 3
    b.linear("main_proj", D, D * n_targets)
    b.norm("main_norm.weight", D)
    b.norm("norm.weight", D)
    r = cfg.dspark_markov_rank
    if r:
        b.add("markov_head.embed.weight", (cfg.vocab_size, r), BF16_OR_FP32, "dense")
        b.add("markov_head.head.weight", (cfg.draft_vocab_size or cfg.vocab_size, r), BF16_OR_FP32, "dense")
    b.add("confidence_head.proj.weight", (1, D + r), BF16_OR_FP32, "dense")
    return b.specs


MTP_OPTIONAL_HEADS = ("confidence_head.proj.weight",)


def optional_tensors(cfg: DeepseekV41Config) -> dict[str, TensorSpec]:
    """Tensors a VL checkpoint may carry per layer (``ffn.gate.bias_vl``); used only to check shapes."""
    out = {}
    for i in range(cfg.num_hidden_layers):
        out[f"layers.{i}.ffn.gate.bias_vl"] = TensorSpec((cfg.n_routed_experts,), FP32, "fp32")
    for i in range(cfg.n_mtp_layers):
        out[f"mtp.{i}.ffn.gate.bias_vl"] = TensorSpec((cfg.draft_n_routed_experts,), FP32, "fp32")
    return out


__all__ = ["expected_tensors", "mtp_layer_tensors", "mtp_head_tensors", "optional_tensors", "VISION_PREFIXES",
           "MTP_PREFIX", "MTP_OPTIONAL_HEADS"]
