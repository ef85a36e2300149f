"""Built-in ops: one family per module, each exporting ``OPS`` (reference-first specs)."""
from __future__ import annotations

import importlib

FAMILIES = ("norm", "rope", "attention", "compress", "indexer", "mhc", "moe", "gemm", "sampling", "structured",
            "candidates", "engram", "cache", "kv", "stream")


def register_builtin_ops(registry) -> None:
    for fam in FAMILIES:
        try:
            mod = importlib.import_module(f"deepinfer_core.kernels.ops.{fam}")
        except ModuleNotFoundError as exc:
            if exc.name == f"deepinfer_core.kernels.ops.{fam}":
                continue  # family not present in this build
            raise
        for spec in mod.OPS:
            registry.register_op(spec)
