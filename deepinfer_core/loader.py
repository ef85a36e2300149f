"""Safetensors checkpoint loading with precise errors (model-agnostic).

A model describes what it needs as ``{name: TensorSpec}``; ``load_checkpoint``
finds the files (one ``model.safetensors`` or shards listed by
``model.safetensors.index.json``), checks every tensor's presence, shape and
dtype from the file headers *before* reading data, and returns memory-mapped
tensors. Every failure is a ``CheckpointError`` naming the tensor and the file.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

import torch

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

# safetensors header dtype strings -> torch dtypes
_ST_DTYPES: dict[str, torch.dtype] = {
    "BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "U16": torch.uint16,
    "I32": torch.int32, "U32": torch.uint32, "I64": torch.int64, "U64": torch.uint64,
    "F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "F8_E8M0": torch.float8_e8m0fnu,
}


class CheckpointError(ValueError):
    """A checkpoint does not match what the model expects, or cannot be read."""


@dataclass(frozen=True)
class TensorSpec:
    """What one checkpoint tensor must look like.

    ``shape``: exact shape; ``dtypes``: the accepted storage dtypes (first one is
    the canonical dtype a writer should use); ``role``: free-form tag the model
    uses to know how to treat it (e.g. ``"fp8_weight"``, ``"fp8_scale"``).
    """

    shape: tuple[int, ...]
    dtypes: tuple[torch.dtype, ...]
    role: str = ""

    def __post_init__(self) -> None:
        shape = tuple(int(s) for s in self.shape)
        dtypes = (self.dtypes,) if isinstance(self.dtypes, torch.dtype) else tuple(self.dtypes)
        if any(s < 0 for s in shape):
            raise ValueError(f"TensorSpec shape must be non-negative, got {shape}")
        if not dtypes or not all(isinstance(d, torch.dtype) for d in dtypes):
            raise TypeError(f"TensorSpec dtypes must be a non-empty tuple of torch.dtype, got {self.dtypes!r}")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtypes", dtypes)


def _fmt_dtypes(dtypes: Iterable[torch.dtype]) -> str:
    return " or ".join(str(d).replace("torch.", "") for d in dtypes)


def checkpoint_files(model_dir: str | Path) -> dict[str, Path]:
    """Map every tensor name to the file that holds it, from the index or the single file.

    Reads only the index (no tensor data); shard existence is checked here.
    """
    root = Path(model_dir)
    if not root.is_dir():
        raise CheckpointError(f"checkpoint directory {root} does not exist")
    index = root / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{index} is not a valid safetensors index (needs a 'weight_map'): {exc}") from None
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index}: 'weight_map' must map tensor names to shard files")
        out: dict[str, Path] = {}
        for name, shard in weight_map.items():
            path = root / shard
            if not path.is_file():
                raise CheckpointError(f"{index} maps tensor {name!r} to shard {shard!r}, which does not exist "
                                      f"in {root}")
            out[name] = path
        return out
    single = root / SINGLE_FILE
    if single.is_file():
        return {name: single for name in _open(single).keys()}
    found = sorted(p.name for p in root.glob("*.safetensors"))
    hint = f" (found {found} but no {INDEX_FILE})" if found else ""
    raise CheckpointError(f"no {SINGLE_FILE} or {INDEX_FILE} in {root}{hint}")


def _open(path: Path):
    """``safe_open`` with file-naming errors (header truncated/corrupt, unreadable file)."""
    from safetensors import safe_open

    try:
        return safe_open(str(path), framework="pt")
    except Exception as exc:  # SafetensorError, OSError: the message must name the file
        raise CheckpointError(f"cannot read safetensors file {path}: {exc}") from None


def load_checkpoint(model_dir: str | Path, expected: Mapping[str, TensorSpec], skip_prefixes: Iterable[str] = (),
                    progress: bool = True) -> dict[str, torch.Tensor]:
    """Load and validate every tensor of a safetensors checkpoint.

    ``expected``: ``{name: TensorSpec}``, the complete set the model needs.
    ``skip_prefixes``: names starting with one of these are ignored (e.g. a
    draft head the target model does not load). Returns ``{name: tensor}``
    (memory-mapped, dtype as stored) for exactly the expected names.

    Raises ``CheckpointError`` for: a missing or unreadable/truncated file, an
    index entry pointing to a missing shard or to a shard that lacks the
    tensor, a tensor present in two shards, a missing expected tensor, an
    unexpected tensor, a wrong shape, a wrong dtype.
    """
    from tqdm.auto import tqdm

    skip = tuple(skip_prefixes)
    for name, spec in expected.items():
        if not isinstance(spec, TensorSpec):
            raise TypeError(f"expected[{name!r}] must be a TensorSpec, got {type(spec).__name__}")
    root = Path(model_dir)
    name_to_file = checkpoint_files(root)
    by_file: dict[Path, list[str]] = {}
    for name, path in name_to_file.items():
        by_file.setdefault(path, []).append(name)

    # Headers first: open each file once and check its names against the index.
    handles = {}
    for path, names in by_file.items():
        handles[path] = h = _open(path)
        in_file = set(h.keys())
        for name in names:
            if name not in in_file:
                raise CheckpointError(f"tensor {name!r} is listed in {root / INDEX_FILE} for {path.name} but "
                                      f"{path} does not contain it")
    if (root / INDEX_FILE).is_file():
        for path, h in handles.items():
            for name in h.keys():
                owner = name_to_file.get(name)
                if owner != path:
                    where = f"is mapped to {owner.name}" if owner else "is not listed"
                    raise CheckpointError(f"tensor {name!r} in {path} {where} in {root / INDEX_FILE}")

    unexpected = sorted(n for n in name_to_file if n not in expected and not n.startswith(skip))
    if unexpected:
        shown = ", ".join(f"{n!r} (in {name_to_file[n].name})" for n in unexpected[:8])
        more = f" and {len(unexpected) - 8} more" if len(unexpected) > 8 else ""
        raise CheckpointError(f"{len(unexpected)} unexpected tensor(s) in {root}: {shown}{more}")
    missing = sorted(n for n in expected if n not in name_to_file)
    if missing:
        files = sorted({p.name for p in name_to_file.values()}) or ["<no tensors>"]
        shown = ", ".join(repr(n) for n in missing[:8])
        more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
        raise CheckpointError(f"{len(missing)} tensor(s) missing from {root} (searched {files}): {shown}{more}")

    # Shapes and dtypes from the headers, before touching any data.
    for name, spec in expected.items():
        path = name_to_file[name]
        try:
            sl = handles[path].get_slice(name)
            shape, st_dtype = tuple(sl.get_shape()), sl.get_dtype()
        except Exception as exc:
            raise CheckpointError(f"cannot read header of tensor {name!r} in {path}: {exc}") from None
        if shape != spec.shape:
            raise CheckpointError(f"tensor {name!r} in {path}: expected shape {list(spec.shape)}, got {list(shape)}")
        dtype = _ST_DTYPES.get(st_dtype)
        if dtype not in spec.dtypes:
            got = str(dtype).replace("torch.", "") if dtype is not None else st_dtype
            raise CheckpointError(f"tensor {name!r} in {path}: expected dtype {_fmt_dtypes(spec.dtypes)}, got {got}")

    out: dict[str, torch.Tensor] = {}
    bar = tqdm(total=len(expected), desc="Loading safetensors", unit="tensor", disable=not progress)
    try:
        for path, names in by_file.items():
            for name in names:
                if name not in expected:
                    continue
                try:
                    out[name] = handles[path].get_tensor(name)
                except Exception as exc:
                    raise CheckpointError(f"cannot read tensor {name!r} from {path} (truncated or corrupt?): "
                                          f"{exc}") from None
                bar.update(1)
    finally:
        bar.close()
    return out


__all__ = ["CheckpointError", "TensorSpec", "load_checkpoint", "checkpoint_files", "SINGLE_FILE", "INDEX_FILE"]
