"""Kernel selection modes that apply while a model resolves its kernels."""
from __future__ import annotations

import contextlib
import contextvars
import os

_BATCH_INVARIANT: contextvars.ContextVar[bool | None] = contextvars.ContextVar("deepinfer_batch_invariant", default=None)


def batch_invariant_enabled() -> bool:
    """The active ``kernel_mode``, else ``DEEPINFER_BATCH_INVARIANT=1``."""
    v = _BATCH_INVARIANT.get()
    if v is not None:
        return v
    return os.environ.get("DEEPINFER_BATCH_INVARIANT", "").strip().lower() in ("1", "true", "yes", "on")


@contextlib.contextmanager
def kernel_mode(batch_invariant: bool | None = None):
    """Resolve kernels inside this block in (or out of) batch-invariant mode (None: env default)."""
    token = _BATCH_INVARIANT.set(batch_invariant)
    try:
        yield
    finally:
        _BATCH_INVARIANT.reset(token)
