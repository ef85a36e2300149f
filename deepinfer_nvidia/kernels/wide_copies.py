"""Widened copies of half-precision weights, made once and kept while the weight lives.

Why (docs/performance_pass_44.md). With ``DEEPINFER_NATIVE_FLOAT_PROJECTIONS`` (on) the fp32 projections (the MoE
router, the compressors' ``wkv`` / ``wgate``) keep the checkpoint's bf16 weights, so the 1-4-row GEMV reads half the
bytes (batch 1 -15 to -30 us on an H100). Above four rows ``gemm.dense_wide`` multiplies with cuBLAS in fp32, which
needs the weight in fp32: a cast a call wrote and read a full fp32 copy each time (a V4.1 batch-32 step +65 us,
pass44b). Here the first such call outside a CUDA-graph capture keeps its copy, and later calls (a captured graph
among them) read it. The copy is the weight's own values widened (exact), so the products are the same bits.
Measured (pass44e, H100): with it the native projections took batch 1 -15 us and left V4.1's and V4's batch 32 even,
so they are on.

A copy is dropped with its weight (a weak reference), and remade if the weight was changed in place (its version
counter, where it has one; inference tensors have none and are not expected to change). During a capture with no copy
yet, the cast is captured as any op would be (correct, and as slow as before). ``DEEPINFER_NV_WIDE_COPIES=0``: a
cast every call.
"""
from __future__ import annotations

import os
import weakref

import torch

WIDE_COPIES = os.environ.get("DEEPINFER_NV_WIDE_COPIES", "1") == "1"
# id(weight) -> (weak reference to it, its version when copied, the copy)
_COPIES: dict[int, tuple[weakref.ref, int, torch.Tensor]] = {}


def _version(w: torch.Tensor) -> int:
    try:
        return w._version
    except RuntimeError:  # an inference tensor: no version counter
        return -1


def _forget(key: int, ref: weakref.ref) -> None:
    entry = _COPIES.get(key)
    if entry is not None and entry[0] is ref:  # not a later weight that took the same id
        del _COPIES[key]


def widened(w: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``w`` as ``dtype``: w itself if it already is; else its kept copy (made now, outside a capture, if there is
    none or w changed since)."""
    if w.dtype == dtype:
        return w
    if not WIDE_COPIES:
        return w.to(dtype)
    key = id(w)
    entry = _COPIES.get(key)
    if entry is not None and entry[0]() is w and entry[1] == _version(w) and entry[2].dtype == dtype:
        return entry[2]
    copy = w.to(dtype)
    if not (w.is_cuda and torch.cuda.is_current_stream_capturing()):
        ref = weakref.ref(w, lambda r, k=key: _forget(k, r))
        _COPIES[key] = (ref, _version(w), copy)
    return copy


def kept() -> int:
    """Copies kept now (tests)."""
    return len(_COPIES)
