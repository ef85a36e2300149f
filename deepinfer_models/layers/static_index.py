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
    idx = torch.where(src_kept, slots[src], torch.zeros_like(slots))
    # when nothing is kept, every write puts row 0's current value back (index k of the extension)
    values = torch.cat([rows, cache[:1]])[torch.where(src_kept, src, torch.full_like(src, k))]
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
