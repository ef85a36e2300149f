"""Cache writes: ``cache.write_rows``, the masked row store of every KV / state cache update.

The op writes in place and also returns the cache: the registry has no notion of an in-place
op, and returning the written tensor is what lets the shared conformance harness compare a
provider's result with the reference's (a ``None`` result would compare trivially equal).

The reference must stay capturable in a CUDA graph: no host synchronisation, so no boolean-mask
indexing (``cache[slots[keep]] = rows[keep]``), no ``nonzero`` and no branch on a tensor value.
It gives results bit-identical to that masked form by redirecting every row that is not kept to
repeat the write of the first kept row (same slot, same value), so no extra row of the cache is
touched; when no row is kept, row 0 of the cache is written with its own current value.
"""
from __future__ import annotations

import torch

from deepinfer_core.kernels.spec import OpSpec


def check_write_rows(cache: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor,
                     keep: torch.Tensor | None) -> None:
    """Shape / dtype contract of ``cache.write_rows`` (host-side metadata only: never syncs).

    Shared with the providers so that a contract violation raises the same error everywhere."""
    if cache.dim() < 1:
        raise ValueError("cache.write_rows: cache must be [N, *E] (at least 1-D), got a 0-d tensor")
    if slots.dim() != 1:
        raise ValueError(f"cache.write_rows: slots must be 1-D [K], got shape {tuple(slots.shape)}")
    if slots.dtype.is_floating_point or slots.dtype.is_complex or slots.dtype == torch.bool:
        raise TypeError(f"cache.write_rows: slots must be an integer tensor, got {slots.dtype}")
    want = (slots.shape[0], *cache.shape[1:])
    if tuple(rows.shape) != want:
        raise ValueError(f"cache.write_rows: rows must be [K, *E] = {want} (K from slots, E from the cache's "
                         f"row shape {tuple(cache.shape[1:])}), got {tuple(rows.shape)}")
    if keep is not None:
        if tuple(keep.shape) != (slots.shape[0],):
            raise ValueError(f"cache.write_rows: keep must have the slots' shape [{slots.shape[0]}], "
                             f"got {tuple(keep.shape)}")
        if keep.dtype != torch.bool:
            raise TypeError(f"cache.write_rows: keep must be a bool tensor, got {keep.dtype}")


def write_rows(cache: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor,
               keep: torch.Tensor | None = None) -> torch.Tensor:
    """``cache[slots[i]] = rows[i].to(cache.dtype)`` for each i with ``keep[i]``, in place; returns ``cache``.

    cache [N, *E] any dtype (a 1-D cache [N] takes scalar rows); slots [K] integer (int64 in the
    models); rows [K, *E] any dtype, cast to ``cache.dtype``; keep [K] bool or None (all rows). A
    negative slot is never written, kept or not (slot -1 means "not written": a position served from a
    shared prefix-cache block), so a caller's padding mask needs no ``& (slots >= 0)`` of its own. The
    kept slots must be distinct (as for the masked form, whose result would otherwise depend on the
    write order) and lie below N.
    K == 0, N == 0 or an empty row: nothing is written. No host synchronisation.
    """
    check_write_rows(cache, slots, rows, keep)
    k = slots.shape[0]
    if k == 0 or cache.numel() == 0:
        return cache
    keep = slots >= 0 if keep is None else keep & (slots >= 0)
    rows = rows.to(cache.dtype)
    first = torch.argmax(keep.to(torch.int32))  # the first kept row (0 when none is kept)
    src = torch.where(keep, torch.arange(k, device=slots.device), first)  # a kept row for every row
    src_kept = keep[src]  # all False only when no row is kept
    idx = torch.where(src_kept, slots[src], 0)
    # when nothing is kept, every write puts row 0's current value back (index k of the extension)
    values = torch.cat([rows, cache[:1]])[torch.where(src_kept, src, k)]
    cache.index_put_((idx,), values)
    return cache


# -- input generator: CPU tensors built from ``seed``, then moved to ``device`` --------------------------
def _case(g, n, e, k, rows_dtype, cache_dtype, pattern, with_keep):
    """One (cache, slots, rows, keep) case; ``pattern`` in 'none' / 'all' / 'some' kept."""
    if cache_dtype == torch.int64:
        cache = torch.randint(-5, 10 ** 6, (n, *e), generator=g)
        rows = torch.randint(0, 10 ** 6, (k, *e), generator=g).to(rows_dtype)
    else:
        cache = torch.randn(n, *e, generator=g).to(cache_dtype)
        rows = torch.randn(k, *e, generator=g).to(rows_dtype)
    slots = torch.randperm(n, generator=g)[:k]  # distinct
    if pattern == "none":
        slots[:] = -1
    elif pattern == "some":
        slots[torch.rand(k, generator=g) < 0.4] = -1
    keep = None
    if with_keep:
        keep = torch.rand(k, generator=g) < 0.7  # keep given: a padding mask that may keep a -1 slot (not written)
    return cache, slots, rows, keep


def _gen(dtype, device, seed):
    """Cases over (N, E, K), keep patterns and dtype conversions; ``dtype`` is the rows' float dtype."""
    g = torch.Generator().manual_seed(seed)
    other = torch.bfloat16 if dtype == torch.float32 else torch.float32
    cases = [
        # (N, E, K, rows dtype, cache dtype, kept pattern, keep given)
        (64, (16,), 8, dtype, dtype, "all", False),
        (64, (16,), 8, dtype, dtype, "none", False),
        (64, (16,), 8, dtype, dtype, "some", False),
        (100, (33,), 17, dtype, dtype, "some", True),
        (100, (33,), 17, dtype, dtype, "none", True),  # all slots -1 and a keep mask
        (40, (2, 3), 9, dtype, dtype, "some", False),  # multi-dim rows
        (300, (), 20, dtype, dtype, "some", True),  # 1-D cache, scalar rows
        (50, (512,), 12, dtype, other, "some", False),  # rows cast to the cache dtype
        (50, (24,), 7, other, dtype, "all", True),
        (200, (16,), 11, torch.int64, torch.int64, "some", True),  # token ids (engram history)
        (160, (), 16, torch.int64, torch.int64, "some", False),
        (8, (4,), 8, dtype, dtype, "all", False),  # every row of the cache written
        (30, (7,), 1, dtype, dtype, "all", False),  # one row (a decode step of one request)
    ]
    for n, e, k, rd, cd, pattern, with_keep in cases:
        cache, slots, rows, keep = _case(g, n, e, k, rd, cd, pattern, with_keep)
        yield (cache.to(device), slots.to(device), rows.to(device), None if keep is None else keep.to(device)), {}
    # K == 0 and N == 0: no-ops
    yield (torch.randn(5, 4).to(dtype).to(device), torch.zeros(0, dtype=torch.long, device=device),
           torch.zeros(0, 4, dtype=dtype, device=device), None), {}
    yield (torch.zeros(0, 4, dtype=dtype, device=device), torch.full((3,), -1, dtype=torch.long, device=device),
           torch.zeros(3, 4, dtype=dtype, device=device), None), {}


def same_bits(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    """A copy is exact: the written cache must equal the reference's bit for bit (NaN-safe)."""
    assert out.shape == ref.shape and out.dtype == ref.dtype, (out.shape, ref.shape, out.dtype, ref.dtype)
    a, b = out.contiguous(), ref.contiguous()
    if a.is_floating_point():
        ints = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        a, b = a.view(ints), b.view(ints)
    assert torch.equal(a, b), f"cache.write_rows: {int((a != b).sum())} elements differ from the reference"


OPS = [
    OpSpec("cache.write_rows", write_rows, _gen, compare=same_bits,
           doc="masked in-place row store into a cache (returns the cache)"),
]
