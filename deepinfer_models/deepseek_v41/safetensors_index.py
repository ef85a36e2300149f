"""Header-level view of a safetensors checkpoint, and memory-mapped access to single tensors.

``deepinfer_core.loader.load_checkpoint`` reads every tensor it validates. V4.1 needs two
things it does not do: check tensors it will not load (the DSpark ``mtp.*`` stages) from
their headers only, and map the Engram tables (about 189 GiB on the real model) into host
memory without reading them. Both work from ``stored_tensors(model_dir)``, which parses each
file's JSON header (8-byte little-endian length, then the JSON; data follows).
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from deepinfer_core.loader import CheckpointError, TensorSpec, checkpoint_files

# safetensors header dtype strings -> torch dtypes
ST_DTYPES: dict[str, torch.dtype] = {
    "BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "I32": torch.int32,
    "I64": torch.int64, "F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "F8_E8M0": torch.float8_e8m0fnu,
}


@dataclass(frozen=True)
class StoredTensor:
    """Where a tensor lives: file, dtype (torch, None if unknown), shape, absolute byte range."""

    path: Path
    st_dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def dtype(self) -> torch.dtype | None:
        return ST_DTYPES.get(self.st_dtype)


def _read_header(path: Path) -> tuple[dict, int]:
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise CheckpointError(f"safetensors file {path} is truncated (no header)")
            (n,) = struct.unpack("<Q", raw)
            header = json.loads(f.read(n))
    except (OSError, ValueError) as exc:
        if isinstance(exc, CheckpointError):
            raise
        raise CheckpointError(f"cannot read safetensors header of {path}: {exc}") from None
    return header, 8 + n


def stored_tensors(model_dir: str | Path) -> dict[str, StoredTensor]:
    """Every tensor of the checkpoint (index or single file) from the headers alone."""
    name_to_file = checkpoint_files(model_dir)
    out: dict[str, StoredTensor] = {}
    for path in sorted(set(name_to_file.values())):
        header, data_start = _read_header(path)
        for name, meta in header.items():
            if name == "__metadata__" or name_to_file.get(name) != path:
                continue  # load_checkpoint reports index/file mismatches with the full story
            b, e = meta["data_offsets"]
            out[name] = StoredTensor(path, meta["dtype"], tuple(meta["shape"]), data_start + b, data_start + e)
    return out


def check_stored(name: str, st: StoredTensor | None, spec: TensorSpec, what: str = "tensor") -> None:
    """Raise CheckpointError naming ``name`` if it is absent or has the wrong shape/dtype."""
    if st is None:
        raise CheckpointError(f"{what} {name!r} is missing from the checkpoint")
    if st.shape != spec.shape:
        raise CheckpointError(f"{what} {name!r} in {st.path}: expected shape {list(spec.shape)}, got {list(st.shape)}")
    if st.dtype not in spec.dtypes:
        want = " or ".join(str(d).replace("torch.", "") for d in spec.dtypes)
        raise CheckpointError(f"{what} {name!r} in {st.path}: expected dtype {want}, got {st.st_dtype}")


def mmap_tensor(st: StoredTensor) -> torch.Tensor:
    """The tensor as a read-only-by-convention view of the file (copy-on-write private mapping):
    pages are read from disk only when touched."""
    dtype = st.dtype
    if dtype is None:
        raise CheckpointError(f"tensor in {st.path} has unsupported dtype {st.st_dtype}")
    nbytes = st.end - st.begin
    itemsize = torch.empty((), dtype=dtype).element_size()
    numel = 1
    for s in st.shape:
        numel *= s
    if nbytes != numel * itemsize:
        raise CheckpointError(f"tensor in {st.path} has {nbytes} bytes for shape {list(st.shape)} {st.st_dtype}")
    if nbytes == 0:
        return torch.empty(st.shape, dtype=dtype)
    raw = np.memmap(st.path, dtype=np.uint8, mode="c", offset=st.begin, shape=(nbytes,))
    return torch.from_numpy(raw).view(dtype).view(st.shape)


__all__ = ["StoredTensor", "stored_tensors", "check_stored", "mmap_tensor", "ST_DTYPES"]
