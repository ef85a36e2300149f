"""Host-side checks of UE8M0 scale stacks, shared by the Gluon MXFP4 swap experts and the wgmma FP8 GEMV.

Both kernels decode with one multiply per pair (by ``scale * 2^126``) when every scale byte is small enough for
that product to be a finite bf16, and with the exact two-multiply decode otherwise. The answer is read once per
stack on the host and cached here, so a decode step does not synchronise.
"""
from __future__ import annotations

import torch
from torch.multiprocessing.reductions import StorageWeakRef

_SAFE_CACHE: dict[tuple[int, int, int, int], tuple[StorageWeakRef, bool]] = {}


def _version(t: torch.Tensor) -> int:
    """The tensor's in-place version counter; inference-mode tensors (weights loaded under
    ``torch.inference_mode``) keep none, and -1 stands for it (they are not modified after loading)."""
    return -1 if t.is_inference() else t._version


def scales_allow_fast(*scales: torch.Tensor, limit: int = 128) -> bool:
    """True when every UE8M0 byte of the given scale stacks is <= ``limit`` (128 here: then ``scale * 2^126``
    is a finite bf16 and one multiply per pair suffices; ``gluon_fp8_gemv`` asks for 134). One host read per
    stack, cached by storage and version; during CUDA graph capture an unseen stack answers False (the exact
    two-multiply decode) instead of synchronising. The entry holds a weak reference to the *storage* (C++
    level: callers pass fresh views such as ``scale.view(torch.uint8)`` on every call, whose Python objects
    die at once), so a new tensor that reuses a freed stack's memory is checked again while the same weights
    keep hitting the cache."""
    ok = True
    for s in scales:
        key = (s.data_ptr(), s.numel(), _version(s), limit)
        hit = _SAFE_CACHE.get(key)
        if hit is None or hit[0].expired():
            if s.is_cuda and torch.cuda.is_current_stream_capturing():
                return False
            safe = bool((s.view(torch.uint8) <= limit).all())
            hit = _SAFE_CACHE[key] = (StorageWeakRef(s.untyped_storage()), safe)
        ok = ok and hit[1]
    return ok
