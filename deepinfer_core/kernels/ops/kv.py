"""Per-step KV slot metadata: which cache row each token writes and which rows it reads, per paged group.

Every step computes these once per paged KV group (``runner/context.py``). As torch ops they are ~12-16 small
launches per group. In a captured decode step on a GPU each of those launches is a kernel of its own, ~130 per
V4.1 step, so they are ops a platform can serve with one kernel each. Shapes come from the inputs' shapes alone
(no host synchronisation), so the references are capturable too.

Common inputs (int64, on one device): ``table [B, W]`` block table of the group (physical block ids, 0
padded), ``seq [T]`` each token's request index, ``pos [T]`` its position, ``no_write_before [T]`` positions
below which the request's entries are already cached (not written again).

- ``kv.sliding_slots``: a sliding-window group of ``block_size`` tokens per block and ``window`` W. Returns
  ``writes [T]`` (the row of the token's own entry, -1: not written) and ``reads [T, W]`` (column j: the row
  of position ``p - W + 1 + j``, -1 where that position is negative or below the request's window floor).
  A request with a window floor (bounded prefix replay) rebuilds its window, so it writes every position.
- ``kv.compressed_slots``: a group compressed ``ratio`` tokens per entry, ``entries_per_block`` entries per
  block of ``block_size`` tokens. ``writes [T]``: the entry a token closes (``(p+1) % ratio == 0``, at or
  after ``no_write_before``), else -1. ``reads [T, width]``: column g is the row of entry g, -1 for the
  entries the token cannot see yet (``g >= (p+1) // ratio``).
"""
from __future__ import annotations

import torch

from deepinfer_core.kernels.spec import OpSpec


def _check(op: str, table: torch.Tensor, *per_token: torch.Tensor) -> None:
    if table.dim() != 2:
        raise ValueError(f"{op}: table must be [B, W], got shape {tuple(table.shape)}")
    t = per_token[0].shape
    for v in per_token:
        if v.dim() != 1 or v.shape != t:
            raise ValueError(f"{op}: per-token inputs must all be [T], got shapes {[tuple(x.shape) for x in per_token]}")
    for v in (table, *per_token):
        if v.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"{op}: index inputs must be int64 / int32, got {v.dtype}")


def sliding_slots(table: torch.Tensor, seq: torch.Tensor, pos: torch.Tensor, no_write_before: torch.Tensor,
                  floor: torch.Tensor, block_size: int, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(writes [T], reads [T, window]) int64 of a sliding-window group; ``floor [T]``: each token's window
    floor (0: none). See the module docstring."""
    _check("kv.sliding_slots", table, seq, pos, no_write_before, floor)
    if block_size < 1 or window < 1:
        raise ValueError(f"kv.sliding_slots: block_size and window must be >= 1, got {block_size}, {window}")
    bs, w, p = int(block_size), int(window), pos.long()
    table, seq, floor = table.long(), seq.long(), floor.long()
    own = table[seq, p // bs] * bs + p % bs
    no_write = torch.where(floor > 0, torch.zeros_like(p), no_write_before.long())
    writes = torch.where(p < no_write, torch.full_like(own, -1), own)
    q = p[:, None] - torch.arange(w - 1, -1, -1, device=p.device)[None, :]  # positions p-W+1 .. p
    qc = q.clamp(min=0)
    rows = table[seq[:, None], qc // bs] * bs + qc % bs
    return writes, torch.where(q >= floor[:, None], rows, torch.full_like(rows, -1))


def compressed_slots(table: torch.Tensor, seq: torch.Tensor, pos: torch.Tensor, no_write_before: torch.Tensor,
                     ratio: int, entries_per_block: int, block_size: int, width: int
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """(writes [T], reads [T, width]) int64 of a compressed group. See the module docstring."""
    _check("kv.compressed_slots", table, seq, pos, no_write_before)
    if ratio < 1 or entries_per_block < 1 or block_size < 1 or width < 0:
        raise ValueError(f"kv.compressed_slots: ratio, entries_per_block and block_size must be >= 1 and width "
                         f">= 0, got {ratio}, {entries_per_block}, {block_size}, {width}")
    r, epb, bs, p = int(ratio), int(entries_per_block), int(block_size), pos.long()
    table, seq = table.long(), seq.long()
    last = table.shape[1] - 1
    own = table[seq, ((p // r) * r // bs).clamp(max=last)] * epb + (p // r) % epb
    writes = torch.where(((p + 1) % r == 0) & (p >= no_write_before.long()), own, torch.full_like(own, -1))
    g = torch.arange(int(width), device=p.device)[None, :]
    rows = table[seq[:, None], (g * r // bs).clamp(max=last)] * epb + g % epb
    return writes, torch.where(g < ((p + 1) // r)[:, None], rows, torch.full_like(rows, -1))


def _tokens(g: torch.Generator, b: int, t: int, w: int, blocks: int, bs: int):
    """A random step: B requests over a [B, W] table of distinct block ids, T tokens at valid positions."""
    table = torch.randperm(blocks, generator=g)[:b * w].view(b, w)
    seq = torch.sort(torch.randint(0, b, (t,), generator=g)).values
    pos = torch.randint(0, w * bs, (t,), generator=g)
    nwb = torch.where(torch.rand(t, generator=g) < 0.3, torch.randint(0, w * bs, (t,), generator=g),
                      torch.zeros(t, dtype=torch.long))
    return table, seq, pos, nwb


def _gen_sliding(dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    for b, t, w, bs, window in [(1, 1, 4, 16, 8), (3, 7, 5, 16, 32), (4, 20, 9, 8, 128), (2, 0, 3, 16, 4)]:
        table, seq, pos, nwb = _tokens(g, b, t, w, 4 * b * w, bs)
        floor = torch.where(torch.rand(t, generator=g) < 0.3, torch.randint(0, 40, (t,), generator=g),
                            torch.zeros(t, dtype=torch.long))
        yield tuple(a.to(device) for a in (table, seq, pos, nwb, floor)) + (bs, window), {}


def _gen_compressed(dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    for b, t, w, bs, r, width in [(1, 1, 4, 16, 4, 16), (3, 9, 6, 16, 2, 48), (2, 12, 8, 64, 128, 4),
                                  (4, 17, 5, 8, 1, 40), (2, 0, 3, 16, 4, 8)]:
        table, seq, pos, nwb = _tokens(g, b, t, w, 4 * b * w, bs)
        yield tuple(a.to(device) for a in (table, seq, pos, nwb)) + (r, max(1, bs // r), bs, width), {}


def _exact(out, ref, dtype) -> None:
    for o, rr in zip(out, ref, strict=True):
        assert o.shape == rr.shape and torch.equal(o.cpu().long(), rr.cpu().long()), "slot metadata differs"


OPS = [
    OpSpec("kv.sliding_slots", sliding_slots, _gen_sliding, compare=_exact,
           doc="per-token write row and window read rows of a sliding-window group"),
    OpSpec("kv.compressed_slots", compressed_slots, _gen_compressed, compare=_exact,
           doc="per-token write entry and visible entry rows of a compressed group"),
]
