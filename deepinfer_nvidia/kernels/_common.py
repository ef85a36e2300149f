"""Shared helpers of the Triton kernel modules: operand coverage and the reference hand-off.

Every public kernel wrapper follows one rule: contract violations (wrong ranks,
mismatched sizes, bad dtypes) raise the same errors the reference raises,
because the wrapper calls the op's own validation or the reference itself.
Operands the kernel does not cover (CPU tensors, fp64 textbook tests,
non-contiguous layouts it cannot stride) go to the op's reference, and the
first such hand-off per (op, reason) is logged, so it is never silent.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Callable

import torch

logger = logging.getLogger("deepinfer_nvidia.kernels")

# Activation dtypes the kernels compute in (fp32 accumulation for both).
FLOATS = (torch.float32, torch.bfloat16, torch.float16)

_warned: set[tuple[str, str]] = set()

# Programmatic dependent launch (SM90+; ``DEEPINFER_NV_PDL=0`` turns it off): the kernels of a decode step start
# with a device-side wait for their predecessor and are launched with the programmatic attribute (``triton_pdl``),
# so each launch's latency overlaps the previous kernel; the wgmma FP8 GEMV also requests its first weight tiles
# before its wait. On since the twentieth pass (docs/performance.md): the engine's outputs are bit-equal with and
# without it, and the graphed V4.1 step took 3.02-3.03 -> 2.81 ms at batch 1 in two same-run readings.
PDL = int(os.environ.get("DEEPINFER_NV_PDL", "1"))


def on_cuda(*tensors: torch.Tensor | None) -> bool:
    """True when every given tensor (None skipped) lives on a CUDA device."""
    return all(t is None or (isinstance(t, torch.Tensor) and t.is_cuda) for t in tensors)


def hand_off(op: str, reason: str, reference: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run ``reference`` for operands the kernel does not cover; log the first hand-off per reason."""
    key = (op, reason)
    if key not in _warned:
        _warned.add(key)
        logger.warning("%s[triton]: %s; running the torch reference for these operands", op, reason)
    return reference(*args, **kwargs)


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (>= 1)."""
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def tl_dtype(dtype: torch.dtype):
    """The triton dtype of a torch float dtype (imported lazily with triton)."""
    import triton.language as tl

    return {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}[dtype]


def dot_precision(dtype: torch.dtype) -> str:
    """``tl.dot`` input precision: full fp32 for fp32 operands (tf32 misses the 1e-4 bound), else native."""
    return "ieee" if dtype == torch.float32 else "tf32"
