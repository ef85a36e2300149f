"""``triton_moe.align`` in one launch for decode-sized routings.

The torch form of ``align`` (a stable argsort, a scatter-add histogram, two cumulative sums, gathers, a
scatter, a ``searchsorted``) is ~20 small launches: 37-79 us per call in a CUDA graph on the H200. Here one
program does it for up to ``ALIGN_MAX_PAIRS`` pairs:

1. the keys ``e_i * PB + i`` (expert, then routing order) are sorted in registers (``tl.sort``);
2. a histogram of the experts gives each expert's pair count, its padded size
   (``ceil(count / block_m) * block_m``) and, by exclusive cumulative sums, its unpadded and padded starts;
3. the k-th sorted pair goes to row ``padded_start[e] + (k - unpadded_start[e])``: ``pair`` is filled with
   the sentinel P, then ``pair[dest] = i``; ``block_expert`` with ``experts``, then
   ``block_expert[dest // block_m] = e`` (every block of an expert holds at least one of its pairs).

The output equals the torch form's exactly (same rows, same sentinel, same block owners). No host
synchronisation (CUDA-graph safe). Measured (fourteenth pass, ``docs/perf/pass14b/align.json``): 2.2 us at 6
pairs, 5.3 us at 384, 19 us at 1536; the O(P^2) comparison kernel it replaced took 29 us at 384 pairs.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from deepinfer_nvidia.kernels.triton_pdl import pdl_enter, pdl_launch

# Largest pair count served by the one-launch kernel (the torch form above it): batch 256 x 6 slots fits.
ALIGN_MAX_PAIRS = 2048


@triton.jit
def _align_sort_kernel(ids_ptr, scratch_ptr, pair_ptr, bexp_ptr, P, E, NROWS, NB, BLOCK_M: tl.constexpr,
                       PB: tl.constexpr, EB: tl.constexpr, PDL: tl.constexpr = 0):
    """Keys ``e * PB + i`` sorted put the pairs in (expert, routing order), so the k-th sorted pair's row is
    its expert's padded start + (k - its expert's unpadded start)."""
    pdl_enter(PDL)
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


def align_small(ids: torch.Tensor, experts: int, block_m: int, nb: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``triton_moe.align`` for ``ids.numel() <= ALIGN_MAX_PAIRS`` in one launch; ``nb`` = its block bound."""
    flat = ids.reshape(-1)
    flat = flat if flat.is_contiguous() else flat.contiguous()
    p = flat.numel()
    pair = torch.empty(nb * block_m, dtype=torch.int32, device=flat.device)
    bexp = torch.empty(nb, dtype=torch.int32, device=flat.device)
    pb = max(16, triton.next_power_of_2(max(p, 1)))
    eb = max(16, triton.next_power_of_2(experts))
    scratch = torch.empty(2 * eb, dtype=torch.int32, device=flat.device)
    _align_sort_kernel[(1,)](flat, scratch, pair, bexp, p, experts, nb * block_m, nb, BLOCK_M=block_m, PB=pb, EB=eb,
                             num_warps=8 if pb >= 512 else 4, **pdl_launch())
    return pair, bexp
