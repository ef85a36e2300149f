"""Load a native DeepSeek-V4.1 checkpoint directory into ``DeepseekV41ForCausalLM``.

What is read, and how:
- the target model's tensors (``weights.expected_tensors``), validated and loaded by core's
  ``load_checkpoint``; MXFP4 experts are checked first so a wrong packing is named as such;
- Engram tables, validated from the headers and memory-mapped (never read eagerly); with
  ``engram_on_host=True`` they stay in host memory even when the model runs on a device;
- the DSpark stages ``mtp.{i}.*``: shapes and dtypes checked from the headers, not loaded
  (the draft forward belongs to DSpark);
- ``vision.*`` / ``aligner.*`` / ``image_*``: skipped, with one log line;
- ``ffn.gate.bias_vl`` (VL checkpoints): shape-checked, unused.
The Engram token map is built from the checkpoint's own ``tokenizer.json``.
"""
from __future__ import annotations

import logging
from pathlib import Path

import torch

from deepinfer_core.loader import CheckpointError, load_checkpoint
from deepinfer_models.deepseek_v41.config import DeepseekV41Config
from deepinfer_models.deepseek_v41.engram_hash import build_token_map, token_map_tensor
from deepinfer_models.deepseek_v41.model import DeepseekV41ForCausalLM
from deepinfer_models.deepseek_v41.safetensors_index import StoredTensor, check_stored, mmap_tensor, stored_tensors
from deepinfer_models.deepseek_v4.moe import is_routed_expert
from deepinfer_models.deepseek_v41.weights import (
    MTP_OPTIONAL_HEADS,
    MTP_PREFIX,
    VISION_PREFIXES,
    expected_tensors,
    mtp_head_tensors,
    mtp_layer_tensors,
    optional_tensors,
)

logger = logging.getLogger(__name__)

ENGRAM_TABLE_ROLES = ("engram_table", "engram_scale")


def _check_expert_packing(specs: dict, stored: dict[str, StoredTensor]) -> None:
    """MXFP4 experts with a wrong layout get an error that says what the layout must be."""
    for name, spec in specs.items():
        st = stored.get(name)
        if spec.role != "mxfp4_weight" or st is None:
            continue
        n, half = spec.shape
        if st.shape == spec.shape and st.dtype in spec.dtypes:
            continue
        got = f"{st.st_dtype} {list(st.shape)}"
        raise CheckpointError(
            f"expert weight {name!r} in {st.path} is not packed MXFP4: expected uint8/int8 [{n}, {half}] "
            f"(two e2m1 values per byte along the input dim of {2 * half}), got {got}")


def validate_mtp(cfg: DeepseekV41Config, stored: dict[str, StoredTensor]) -> int:
    """Check the DSpark ``mtp.*`` tensors from their headers. Returns how many were checked.

    No ``mtp.*`` tensor at all is allowed (a target-only checkpoint; logged). Otherwise every
    decoder-block tensor of the ``n_mtp_layers`` stages must be there, and the head tensors
    (main_proj/main_norm/norm, the Markov head, the optional confidence head) exactly once on
    some stage; any other ``mtp.*`` name is an error.
    """
    names = [n for n in stored if n.startswith(MTP_PREFIX)]
    if not names:
        if cfg.n_mtp_layers:
            logger.warning("checkpoint has no DSpark (mtp.*) weights; speculative decoding will be unavailable")
        return 0
    layer_specs = mtp_layer_tensors(cfg)
    heads = mtp_head_tensors(cfg)
    optional = {n: s for n, s in optional_tensors(cfg).items() if n.startswith(MTP_PREFIX)}
    found_heads: dict[str, str] = {}
    for name in names:
        if name in layer_specs:
            continue
        if name in optional:
            check_stored(name, stored[name], optional[name], "DSpark tensor")
            continue
        parts = name.split(".", 2)
        stage_ok = len(parts) == 3 and parts[1].isdigit() and int(parts[1]) < cfg.n_mtp_layers
        rest = parts[2] if len(parts) == 3 else ""
        if not stage_ok or rest not in heads:
            raise CheckpointError(f"unexpected DSpark tensor {name!r} in {stored[name].path} (n_mtp_layers="
                                  f"{cfg.n_mtp_layers})")
        if rest in found_heads:
            raise CheckpointError(f"DSpark tensor {rest!r} is stored twice: {found_heads[rest]!r} and {name!r}")
        found_heads[rest] = name
        check_stored(name, stored[name], heads[rest], "DSpark tensor")
    for name, spec in layer_specs.items():
        check_stored(name, stored.get(name), spec, "DSpark tensor")
    for rest in heads:
        if rest not in found_heads and rest not in MTP_OPTIONAL_HEADS:
            raise CheckpointError(f"DSpark tensor {MTP_PREFIX}<stage>.{rest} is missing from the checkpoint")
    return len(names)


def load_deepseek_v41(model_dir: str | Path, dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu",
                      platform=None, progress: bool = False, engram_on_host: bool = False,
                      tokenizer_path: str | Path | None = None, **model_kw) -> DeepseekV41ForCausalLM:
    """Build the model from ``model_dir``. ``engram_on_host``: keep the Engram tables memory-mapped
    in host memory instead of copying them to ``device``. ``tokenizer_path``: the ``tokenizer.json``
    for the Engram token map (default: the checkpoint's own). Other keywords go to the model."""
    model_dir = Path(model_dir)
    cfg = DeepseekV41Config.from_pretrained(model_dir)
    specs = expected_tensors(cfg)
    stored = stored_tensors(model_dir)
    vision = [n for n in stored if n.startswith(VISION_PREFIXES)]
    if vision:
        logger.info("skipping %d vision tensors (vision., aligner., image_): DeepInfer serves the text model only",
                    len(vision))
    _check_expert_packing(specs, stored)
    tables = {n: s for n, s in specs.items() if s.role in ENGRAM_TABLE_ROLES}
    for name, spec in tables.items():
        check_stored(name, stored.get(name), spec, "Engram table")
    validate_mtp(cfg, stored)
    optional = {n: s for n, s in optional_tensors(cfg).items() if n in stored and not n.startswith(MTP_PREFIX)}
    wanted = {n: s for n, s in specs.items() if n not in tables}
    wanted.update(optional)
    skip = VISION_PREFIXES + (MTP_PREFIX,) + tuple(tables)  # a full name is its own prefix
    weights = load_checkpoint(model_dir, wanted, skip_prefixes=skip, progress=progress)
    for name in optional:
        weights.pop(name)
    # routed experts stay on the host until MoEV4 stacks them (one device copy, not two)
    weights = {k: v if is_routed_expert(k) else v.to(device) for k, v in weights.items()}
    for name in tables:
        t = mmap_tensor(stored[name])
        weights[name] = t if engram_on_host else t.to(device)
    token_map = None
    if cfg.engram_layer_ids:
        tok = Path(tokenizer_path) if tokenizer_path is not None else model_dir / "tokenizer.json"
        tmap, n_keys = build_token_map(tok)
        if n_keys != cfg.engram_compressed_vocab_size:
            raise CheckpointError(
                f"the tokenizer {tok} normalises to {n_keys} distinct tokens but config.json field "
                f"'engram_compressed_vocab_size' is {cfg.engram_compressed_vocab_size}; every Engram hash "
                "multiplier depends on it, so the tables would be read with the wrong hashes")
        pad = tmap[cfg.engram_pad_token_id] if cfg.engram_pad_token_id < len(tmap) else 0
        token_map = token_map_tensor(tmap, cfg.vocab_size, pad)
    return DeepseekV41ForCausalLM(cfg, weights, dtype=dtype, device=device, platform=platform, token_map=token_map,
                                  **model_kw)


__all__ = ["load_deepseek_v41", "validate_mtp"]
