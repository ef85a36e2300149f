"""``triton_moe.align`` in one launch for decode-sized routings.

The torch form of ``align`` (a stable argsort, a scatter-add histogram, two cumulative sums, gathers, a
scatter, a ``searchsorted``) is ~20 small launches. In a graphed batch-1 step each costs ~1.5-2 us, more than
the expert GEMMs' own time at that size. Here one program does it for up to ``ALIGN_MAX_PAIRS`` pairs:

1. pass 1, per pair i (all pairs in registers, the others streamed in chunks of ``CHUNK``): ``rank_i`` = pairs
   j < i on the same expert, ``total_i`` = pairs on its expert; stored to a scratch row;
2. pass 2: ``start_i`` = the padded sizes (``ceil(total / block_m) * block_m``) of the experts below e_i, summed
   over each expert's first pair; ``dest_i = start_i + rank_i`` is the row of pair i, as in the torch form
   (experts in ascending order, pairs in routing order within an expert);
3. ``pair`` is filled with the sentinel P, then ``pair[dest_i] = i``; ``block_expert`` with ``experts``, then
   ``block_expert[dest_i // block_m] = e_i`` (every block of an expert holds at least one of its pairs).

The output equals the torch form's exactly (same rows, same sentinel, same block owners). O(P^2 / threads)
work: ~1 M comparisons at 1024 pairs. No host synchronisation (CUDA-graph safe).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

# Largest pair count served by the one-launch kernel (the torch form above it).
ALIGN_MAX_PAIRS = 1024


@triton.jit
def _align_kernel(ids_ptr, scratch_ptr, pair_ptr, bexp_ptr, P, E, NROWS, NB, BLOCK_M: tl.constexpr,
                  PB: tl.constexpr, CHUNK: tl.constexpr):
    i = tl.arange(0, PB)
    m = i < P
    e = tl.load(ids_ptr + i, mask=m, other=-1).to(tl.int32)
    rank = tl.zeros([PB], dtype=tl.int32)
    total = tl.zeros([PB], dtype=tl.int32)
    jc = tl.arange(0, CHUNK)
    for c in range(0, P, CHUNK):
        j = c + jc
        ej = tl.load(ids_ptr + j, mask=j < P, other=-2).to(tl.int32)
        same = e[:, None] == ej[None, :]
        total += tl.sum(same.to(tl.int32), axis=1)
        rank += tl.sum((same & (j[None, :] < i[:, None])).to(tl.int32), axis=1)
    padded = (total + (BLOCK_M - 1)) // BLOCK_M * BLOCK_M
    # scratch row: the padded size of each expert's first pair, 0 for the others
    tl.store(scratch_ptr + i, tl.where(rank == 0, padded, 0), mask=m)
    tl.debug_barrier()
    start = tl.zeros([PB], dtype=tl.int32)
    for c in range(0, P, CHUNK):
        j = c + jc
        jm = j < P
        ej = tl.load(ids_ptr + j, mask=jm, other=-2).to(tl.int32)
        pj = tl.load(scratch_ptr + j, mask=jm, other=0)
        start += tl.sum(tl.where(ej[None, :] < e[:, None], pj[None, :], 0), axis=1)
    dest = start + rank
    for r in range(0, NROWS, PB):  # sentinel rows and unused blocks
        tl.store(pair_ptr + r + i, P, mask=r + i < NROWS)
    for b in range(0, NB, PB):
        tl.store(bexp_ptr + b + i, E, mask=b + i < NB)
    tl.debug_barrier()
    tl.store(pair_ptr + dest, i, mask=m)
    tl.store(bexp_ptr + dest // BLOCK_M, e, mask=m)


@triton.jit
def _align_sort_kernel(ids_ptr, scratch_ptr, pair_ptr, bexp_ptr, P, E, NROWS, NB, BLOCK_M: tl.constexpr,
                       PB: tl.constexpr, EB: tl.constexpr):
    """The same layout from one sort: keys ``e * PB + i`` sorted put the pairs in (expert, routing order),
    so the k-th sorted pair's row is its expert's padded start + (k - its expert's unpadded start)."""
    i = tl.arange(0, PB)
    m = i < P
    e = tl.load(ids_ptr + i, mask=m, other=E).to(tl.int32)  # padding keys sort after every real pair
    srt = tl.sort(e * PB + i)
    es = srt // PB
    src = srt % PB
    counts = tl.histogram(e, EB, mask=m)
    padded = (counts + (BLOCK_M - 1)) // BLOCK_M * BLOCK_M
    tl.store(scratch_ptr + tl.arange(0, EB), tl.cumsum(padded, 0) - padded)  # padded start of each expert
    tl.store(scratch_ptr + EB + tl.arange(0, EB), tl.cumsum(counts, 0) - counts)  # unpadded start
    for r in range(0, NROWS, PB):  # sentinel rows and unused blocks
        tl.store(pair_ptr + r + i, P, mask=r + i < NROWS)
    for b in range(0, NB, PB):
        tl.store(bexp_ptr + b + i, E, mask=b + i < NB)
    tl.debug_barrier()
    ok = es < E
    dest = tl.load(scratch_ptr + es, mask=ok, other=0) + i - tl.load(scratch_ptr + EB + es, mask=ok, other=0)
    tl.store(pair_ptr + dest, src, mask=ok)
    tl.store(bexp_ptr + dest // BLOCK_M, es, mask=ok)


def align_sorted(ids: torch.Tensor, experts: int, block_m: int, nb: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``align_small`` by one in-register sort (``_align_sort_kernel``) instead of O(P^2) comparisons."""
    flat = ids.reshape(-1)
    flat = flat if flat.is_contiguous() else flat.contiguous()
    p = flat.numel()
    pair = torch.empty(nb * block_m, dtype=torch.int32, device=flat.device)
    bexp = torch.empty(nb, dtype=torch.int32, device=flat.device)
    pb = max(16, triton.next_power_of_2(max(p, 1)))
    eb = max(16, triton.next_power_of_2(experts))
    scratch = torch.empty(2 * eb, dtype=torch.int32, device=flat.device)
    _align_sort_kernel[(1,)](flat, scratch, pair, bexp, p, experts, nb * block_m, nb, BLOCK_M=block_m, PB=pb, EB=eb,
                             num_warps=8 if pb >= 512 else 4)
    return pair, bexp


def align_small(ids: torch.Tensor, experts: int, block_m: int, nb: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``triton_moe.align`` for ``ids.numel() <= ALIGN_MAX_PAIRS`` in one launch; ``nb`` = its block bound."""
    flat = ids.reshape(-1)
    flat = flat if flat.is_contiguous() else flat.contiguous()
    p = flat.numel()
    pair = torch.empty(nb * block_m, dtype=torch.int32, device=flat.device)
    bexp = torch.empty(nb, dtype=torch.int32, device=flat.device)
    scratch = torch.empty(max(p, 1), dtype=torch.int32, device=flat.device)
    pb = max(16, triton.next_power_of_2(max(p, 1)))
    chunk = min(64, max(8, 16384 // pb))  # the [pb, chunk] comparison tile stays ~64 values per thread
    _align_kernel[(1,)](flat, scratch, pair, bexp, p, experts, nb * block_m, nb, BLOCK_M=block_m, PB=pb,
                        CHUNK=chunk, num_warps=8 if pb >= 512 else 4)
    return pair, bexp
