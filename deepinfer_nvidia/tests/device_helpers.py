"""Helpers shared by the device tests."""
from __future__ import annotations

import torch


def poison_allocator(blocks: int = 4) -> None:
    """Fill ``blocks`` x 256 MB of the caching allocator's free memory with NaN, so a fresh ``torch.empty`` output
    starts as NaN and an element a kernel forgot to write shows."""
    torch.cuda.synchronize()
    blobs = [torch.full((64 << 20,), float("nan"), device="cuda") for _ in range(blocks)]
    del blobs
    torch.cuda.synchronize()


def checked_call(fn, *args):
    """``fn(*args)`` on a NaN-poisoned allocator with any host synchronisation raising (the kernels run inside
    captured decode steps), then synchronised."""
    poison_allocator()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = fn(*args)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    return out
