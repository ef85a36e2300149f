"""Index helpers with data-independent shapes (no host synchronisation).

Boolean-mask indexing (``cache[w[keep]] = rows[keep]``), ``nonzero`` and ``if t.numel()`` on a
data-dependent result all make the host wait for the device, which blocks capturing a whole
step in one CUDA graph. These helpers do the same work with shapes known from the inputs'
shapes alone, and give results bit-identical to the masked forms:

- ``write_rows``: ``cache[slots[i]] = rows[i]`` for the kept rows; every other row is redirected
  to repeat the write of the first kept row (same slot, same value), so no extra row of the cache
  is touched. When no row is kept, row 0 of the cache is written with its own current value.
- ``compact``: the first ``size`` indices of a 1-D mask's True entries (a static-size ``nonzero``),
  with a validity mask for the padding.
- ``closes_any``: whether a step closes any compressor window, read from the host-side slices (no
  sync), so an eager step can skip the pooling; a step captured in a graph sets
  ``ctx.extras["static_shapes"] = True`` and always runs it.
"""
from __future__ import annotations

import torch


def write_rows(cache: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor, keep: torch.Tensor | None = None) -> None:
    """``cache[slots[i]] = rows[i].to(cache.dtype)`` for each i with ``keep[i]`` (default ``slots >= 0``).

    cache [N, *E]; slots [K] int64; rows [K, *E]. The kept slots must be distinct (as for the
    masked form, whose result would otherwise depend on the write order)."""
    k = slots.shape[0]
    if k == 0 or cache.shape[0] == 0:
        return
    if keep is None:
        keep = slots >= 0
    rows = rows.to(cache.dtype)
    first = torch.argmax(keep.to(torch.int32))  # the first kept row (0 when none is kept)
    src = torch.where(keep, torch.arange(k, device=slots.device), first)  # a kept row for every row
    src_kept = keep[src]  # all False only when no row is kept
    idx = torch.where(src_kept, slots[src], 0)
    # when nothing is kept, every write puts row 0's current value back (index k of the extension)
    values = torch.cat([rows, cache[:1]])[torch.where(src_kept, src, k)]
    cache.index_put_((idx,), values)


def compact(mask: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """1-D bool mask [T] -> (idx [size] int64, valid [size] bool): the positions of the first ``size``
    True entries in order (``mask.nonzero()[:size]``), padded with 0 where ``valid`` is False."""
    t = mask.shape[0]
    dev = mask.device
    if size == 0 or t == 0:
        return torch.zeros(size, dtype=torch.long, device=dev), torch.zeros(size, dtype=torch.bool, device=dev)
    rank = torch.cumsum(mask.to(torch.long), 0) - 1  # output slot of each True entry
    tgt = torch.where(mask & (rank < size), rank, torch.full_like(rank, size))  # the rest -> scratch slot `size`
    out = torch.zeros(size + 1, dtype=torch.long, device=dev)
    out.scatter_(0, tgt, torch.arange(t, device=dev))
    valid = torch.arange(size, device=dev) < rank[-1] + 1
    return out[:size], valid


def closes_any(ctx, ratio: int) -> bool:
    """Whether a token of the step closes a window of ``ratio`` (position p with (p+1) % ratio == 0).

    Host-side, from ``ctx.slices`` (a slice feeds positions start .. start+n-1), cached per step in
    ``ctx.extras``; always True when ``ctx.extras["static_shapes"]`` is set (graph capture)."""
    if ctx.extras.get("static_shapes") or not ctx.slices:
        return True
    key = ("closes_any", ratio)
    hit = ctx.extras.get(key)
    if hit is None:
        hit = ctx.extras[key] = any((s.start_pos + s.num_tokens) // ratio > s.start_pos // ratio for s in ctx.slices)
    return hit
