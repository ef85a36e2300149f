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

With the activations given, programs 1.. of the same launch also copy them into the swap experts' K order
(``gluon_moe_swap.permute_k``), which otherwise is one torch copy a call.

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
XB = 1024  # activation elements per permuting program (a 5120-wide token: 5 programs beside the sort)


@triton.jit
def _natural_column(col, PERM: tl.constexpr):
    """Logical column ``col`` of the swap kernels' K order -> its natural column. PERM 1: the low 3 bits
    reversed (an involution, ``_rev3``); 2: per 128 columns, logical 32q + 16S + 8p + 2c + e holds natural
    32c + 8q + 4e + 2S + p (``gluon_moe_swap.permute_k``'s fragment order)."""
    if PERM == 1:
        return (col & -8) | ((col & 1) << 2) | (col & 2) | ((col >> 2) & 1)
    else:
        m = col % 128
        return (col - m) + 32 * ((m // 2) % 4) + 8 * ((m // 32) % 4) + 4 * (m % 2) + 2 * ((m // 16) % 2) + (m // 8) % 2


@triton.jit
def _permute_chunk(x_ptr, xp_ptr, chunk, XN, K, PERM: tl.constexpr, XB: tl.constexpr):
    """Elements ``chunk * XB ..`` of x [XN / K, K] (contiguous) into ``xp`` in the swap kernels' K order."""
    o = chunk * XB + tl.arange(0, XB)
    col = o % K
    om = o < XN
    tl.store(xp_ptr + o, tl.load(x_ptr + (o - col) + _natural_column(col, PERM), mask=om), mask=om)


@triton.jit
def _align_sort_kernel(ids_ptr, scratch_ptr, pair_ptr, bexp_ptr, x_ptr, xp_ptr, P, E, NROWS, NB, XN, K,
                       BLOCK_M: tl.constexpr, PB: tl.constexpr, EB: tl.constexpr, PERM: tl.constexpr,
                       XB: tl.constexpr, PDL: tl.constexpr = 0):
    """Program 0: keys ``e * PB + i`` sorted put the pairs in (expert, routing order), so the k-th sorted pair's
    row is its expert's padded start + (k - its expert's unpadded start). Programs 1..: with PERM > 0, XB
    elements each of the activations x [XN / K, K] (contiguous) copied into the swap kernels' K order ``xp``."""
    pdl_enter(PDL)
    pid = tl.program_id(0)
    if pid > 0:
        _permute_chunk(x_ptr, xp_ptr, pid - 1, XN, K, PERM, XB)
    else:
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


def align_small(ids: torch.Tensor, experts: int, block_m: int, nb: int, x: torch.Tensor | None = None,
                perm: int = 0) -> tuple[torch.Tensor, ...]:
    """``triton_moe.align`` for ``ids.numel() <= ALIGN_MAX_PAIRS`` in one launch; ``nb`` = its block bound.
    With ``x`` (contiguous [T, K]) and ``perm`` 1 or 2, the same launch also returns x in the swap kernels' K
    order (``gluon_moe_swap.permute_k(x, perm == 2)``), one torch copy fewer a call: (pair, block_expert, xp)."""
    flat = ids.reshape(-1)
    flat = flat if flat.is_contiguous() else flat.contiguous()
    p = flat.numel()
    pair = torch.empty(nb * block_m, dtype=torch.int32, device=flat.device)
    bexp = torch.empty(nb, dtype=torch.int32, device=flat.device)
    pb = max(16, triton.next_power_of_2(max(p, 1)))
    eb = max(16, triton.next_power_of_2(experts))
    scratch = torch.empty(2 * eb, dtype=torch.int32, device=flat.device)
    if x is not None and perm:
        if not x.is_contiguous() or x.shape[1] % (128 if perm == 2 else 8):
            raise ValueError(f"align_small: x must be contiguous with K a multiple of {128 if perm == 2 else 8}, "
                             f"got shape {tuple(x.shape)} strides {x.stride()}")
        xp = torch.empty_like(x)
        xn, k = x.numel(), x.shape[1]
    else:
        xp, xn, k, perm = None, 0, 1, 0
    _align_sort_kernel[(1 + triton.cdiv(xn, XB),)](
        flat, scratch, pair, bexp, x if xp is not None else flat, xp if xp is not None else flat, p, experts,
        nb * block_m, nb, xn, k, BLOCK_M=block_m, PB=pb, EB=eb, PERM=perm, XB=XB,
        num_warps=8 if pb >= 512 else 4, **pdl_launch())
    return (pair, bexp) if xp is None else (pair, bexp, xp)
