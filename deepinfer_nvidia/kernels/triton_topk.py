"""Indexer top-k (``index.topk``) without a sort: a bisection select, one program per query row.

The reference sorts every row of scores ``[T, N]`` (a stable descending sort of N fp32 values, then the first
k). On the H200 that is a CUB segmented sort of ~30 us per call in a decode step, for a result that callers
use as a set. Here one program per row:

1. maps each score to a signed integer with the same order (fp32 bits, negatives flipped; ``-0.0`` counted
   as ``+0.0``, so equal floats get equal keys, as in the reference's comparison);
2. finds ``thr``, the k-th largest key among the valid (finite or +inf) scores, over the 32-bit key range: by
   bisection, at most 32 counting passes (``RADIX_BITS = 1``, the default; it stops at a pass that counts
   exactly k, and rows with at most k valid scores need none), or 2^BITS probes a pass spread over the
   remaining range (one [BLOCK, 2^BITS] comparison and one reduction a pass, the same early exit). The keys are
   int32 with invalid scores at INT32_MIN (``KEY32``), so a pass is one compare a score. The row is held in
   registers when it fits one ``BLOCK``, else streamed from global memory / L2 in chunks;
3. keeps every score above ``thr`` and, of those equal to ``thr``, the lowest positions first, exactly as
   many as the reference's stable sort keeps (ties broken towards the lower position);
4. writes the kept positions in ascending position order (a prefix count gives each its slot) and ``-1``
   in the slots past them when fewer than k scores are valid.

So the selected *set* equals the reference's (``index.topk``'s comparator compares sets); the order within
a row is position order, not score order, which is also the order the attention gathers KV rows in.
No host synchronisation; the launch depends only on (T, N, k), and each row's result only on that row
(batch-invariant).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from deepinfer_core.kernels.ops.candidates import candidate_blocks
from deepinfer_core.kernels.ops.indexer import topk_positions
from deepinfer_nvidia.kernels._common import hand_off, next_pow2, on_cuda
from deepinfer_nvidia.kernels.triton_pdl import pdl_enter, pdl_launch

# Rows up to this many scores stay in registers for the counting passes; longer rows are streamed in chunks of
# STREAM_BLOCK.
MAX_BLOCK = 8192
STREAM_BLOCK = 1024
# Bits a counting pass resolves (2^bits probes a pass; 1 is the bisection). The [BLOCK, 2^BITS] comparison is held
# in registers, so wide register blocks take fewer bits (``_bits_for``). 1 stays the default: the passes are bound by
# issue, not by their barriers. On the H200 4-bit digits were slower, 14.4 us a call against 9.4 at 1024 scores
# (nineteenth pass). On an H100, 4 and 8 probes with the early exit were slower too: 10.08 and 10.35 us against 8.19
# at 4096 scores (forty-third pass; a 4-probe pass is 298 instructions against the bisection's 90).
RADIX_BITS = 1
# Whether ``index.candidate_blocks`` launches its kernels (else core's reference runs on the device: a sort).
# On: conformance passed on the H200, and at batch 1 it replaces the sort (21.4 us) and 5 gathers with one 9.4 us
# select (nineteenth pass).
CANDIDATES_KERNEL = True
# The bisection stops at the first pass whose count is exactly k, and does not run for rows with at most k valid
# scores (all kept). The kept set is the same by construction (the positions are written in position order either
# way). Written in the twenty-third pass; measured in the twenty-fourth (H200, one call, batch 1, k 512:
# 15.5 -> 10.0 us at 1024 scores, 30.4 -> 24.1 at 8192; device tests 40 passed).
# ``DEEPINFER_NV_TOPK_EARLY_EXIT=0``: all 32 passes.
EARLY_EXIT = os.environ.get("DEEPINFER_NV_TOPK_EARLY_EXIT", "1") == "1"
# Warps of an ``index.topk`` program (``DEEPINFER_NV_TOPK_WARPS``; 0: 8 for blocks of >= 4096 scores, else 4).
TOPK_WARPS = int(os.environ.get("DEEPINFER_NV_TOPK_WARPS", "0"))
# The bisection's counting passes on int32 keys (``DEEPINFER_NV_TOPK_KEY32``, on; 0: int64 keys with a valid mask,
# as before the forty-third pass): one 32-bit compare a score and no mask a pass, the same counts (every valid key
# lies in (INT32_MIN, INT32_MAX], and so does each probe in (lo, hi]). H100, one call, k 512: 4096 scores 9.40 ->
# 8.19 us, 8192 17.36 -> 14.47 (forty-third pass).
KEY32 = os.environ.get("DEEPINFER_NV_TOPK_KEY32", "1") == "1"


def _bits_for(block: int) -> int:
    """Bits a counting pass resolves for a register block of ``block`` scores: at most 32768 compares a pass."""
    bits = RADIX_BITS
    while bits > 1 and block << bits > 32768:
        bits -= 1
    return bits


@triton.jit
def _keys(s_ptr, row, cols, N, KEY32: tl.constexpr = 0):
    """Scores -> (order-preserving keys, valid mask). int64 keys, invalid (-inf, NaN, out of range) 0; or, with
    ``KEY32``, int32 keys, invalid ``INT32_MIN``: no finite or +inf score maps there (only a NaN's bits do), so a
    count of keys >= any t > INT32_MIN needs no mask."""
    x = tl.load(s_ptr + row + cols, mask=cols < N, other=float("-inf"))
    valid = (cols < N) & (x > float("-inf"))
    x = tl.where(x == 0.0, 0.0, x)  # -0.0 ties with +0.0, as the reference's comparison has it
    b = x.to(tl.int32, bitcast=True)
    key = tl.where(b >= 0, b, b ^ 0x7FFFFFFF)
    if KEY32:
        key = tl.where(valid, key, -2147483648)
    else:
        key = tl.where(valid, key.to(tl.int64), 0)
    return key, valid


@triton.jit
def _count_ge(s_ptr, row, N, t, key0, valid0, BLOCK: tl.constexpr, SINGLE: tl.constexpr, KEY32: tl.constexpr = 0):
    """Number of valid keys >= t in the row (t an int64 scalar; with ``KEY32`` it must lie in (INT32_MIN, INT32_MAX]:
    then one int32 compare a key, no mask)."""
    if SINGLE:
        if KEY32:
            n = tl.sum((key0 >= t.to(tl.int32)).to(tl.int32), axis=0)
        else:
            n = tl.sum((valid0 & (key0 >= t)).to(tl.int32), axis=0)
    else:
        n = 0
        for c0 in range(0, N, BLOCK):
            key, valid = _keys(s_ptr, row, c0 + tl.arange(0, BLOCK), N, KEY32)
            if KEY32:
                n += tl.sum((key >= t.to(tl.int32)).to(tl.int32), axis=0)
            else:
                n += tl.sum((valid & (key >= t)).to(tl.int32), axis=0)
    return n


@triton.jit
def _count_ge_each(s_ptr, row, N, cand, key0, valid0, BLOCK: tl.constexpr, SINGLE: tl.constexpr,
                   KEY32: tl.constexpr = 0):
    """[R] numbers of valid keys >= each of the R candidates ``cand`` [R] (int64; with ``KEY32`` each in
    (INT32_MIN, INT32_MAX]): one [BLOCK, R] compare and one reduction."""
    if SINGLE:
        if KEY32:
            n = tl.sum((key0[:, None] >= cand.to(tl.int32)[None, :]).to(tl.int32), axis=0)
        else:
            n = tl.sum((valid0[:, None] & (key0[:, None] >= cand[None, :])).to(tl.int32), axis=0)
    else:
        n = tl.zeros_like(cand).to(tl.int32)
        for c0 in range(0, N, BLOCK):
            key, valid = _keys(s_ptr, row, c0 + tl.arange(0, BLOCK), N, KEY32)
            if KEY32:
                n += tl.sum((key[:, None] >= cand.to(tl.int32)[None, :]).to(tl.int32), axis=0)
            else:
                n += tl.sum((valid[:, None] & (key[:, None] >= cand[None, :])).to(tl.int32), axis=0)
    return n


@triton.jit
def _topk_kernel(s_ptr, out_ptr, N, K, W, stride_s, BLOCK: tl.constexpr, SINGLE: tl.constexpr,
                 BLOCK_K: tl.constexpr, BITS: tl.constexpr, PDL: tl.constexpr = 0, EARLY: tl.constexpr = 1,
                 KEY32: tl.constexpr = 0):
    pdl_enter(PDL)
    r = tl.program_id(0).to(tl.int64)
    row = r * stride_s
    orow = out_ptr + r * W  # W >= K: the row width, -1 past the kept positions
    cols0 = tl.arange(0, BLOCK)
    key0, valid0 = _keys(s_ptr, row, cols0, N, KEY32)
    # every valid key is above INT32_MIN (only a NaN's bits map there), so this counts the valid scores
    nvalid = _count_ge(s_ptr, row, N, tl.full([], -2147483647, tl.int64), key0, valid0, BLOCK, SINGLE, KEY32)
    # the largest t with count(key >= t) >= K (only meaningful when nvalid > K): count(key >= lo) >= K and
    # count(key > hi) < K hold before each pass, and each pass moves lo up or hi down to its probes' counts
    lo = tl.full([], -2147483648, tl.int64)
    if BITS == 1:  # bisection
        # a row with at most K valid scores keeps them all: no pass at all. A pass whose count is exactly K ends
        # the search: {key >= mid} is then the set, so thr = mid - 1 with no ties to keep (``need`` below is 0).
        # Random fp32 rows end after 11 passes instead of 32 at N 1024, k 512, and after 19 at N 8192 (a CPU model
        # of the loop; bf16-rounded scores, with more ties: 12 and 29). EARLY_EXIT.
        hi = tl.full([], 2147483647, tl.int64)
        if EARLY:
            hi = tl.where(nvalid <= K, lo, hi)
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            c = _count_ge(s_ptr, row, N, mid, key0, valid0, BLOCK, SINGLE, KEY32)  # lo < mid <= hi
            if EARLY:  # c == K: both ends to mid - 1, which ends the loop
                lo = tl.where(c > K, mid, tl.where(c == K, mid - 1, lo))
                hi = tl.where(c > K, hi, mid - 1)
            else:
                lo = tl.where(c >= K, mid, lo)
                hi = tl.where(c >= K, hi, mid - 1)
    else:  # 2^BITS probes a pass, splitting (lo, hi] into 2^BITS near-equal parts: BITS bits a pass
        # probe j (1..P) at lo + ceil(j * (hi - lo) / P), so each lies in (lo, hi] and the last is hi; the new lo is
        # the highest probe that counts >= K, the new hi one below the lowest that counts < K
        P: tl.constexpr = 1 << BITS
        probe = tl.arange(0, P).to(tl.int64) + 1
        hi = tl.full([], 2147483647, tl.int64)
        if EARLY:
            hi = tl.where(nvalid <= K, lo, hi)
        while lo < hi:
            cand = lo + ((probe * (hi - lo) + (P - 1)) >> BITS)
            c = _count_ge_each(s_ptr, row, N, cand, key0, valid0, BLOCK, SINGLE, KEY32)
            new_lo = tl.max(tl.where(c >= K, cand, lo), axis=0)
            new_hi = tl.min(tl.where(c >= K, hi, cand - 1), axis=0)
            if EARLY:  # a probe that counts exactly K: {key >= it} is the set (as the bisection's exit)
                exact = tl.min(tl.where(c == K, cand, 4294967296), axis=0)
                new_lo = tl.where(exact < 4294967296, exact - 1, new_lo)
                new_hi = tl.where(exact < 4294967296, exact - 1, new_hi)
            lo = new_lo
            hi = new_hi
    take_all = nvalid <= K
    thr = tl.where(take_all, -2147483649, lo)  # below every key: every valid score is kept
    # ties at thr to keep (the count's t clamped into KEY32's range: below it only when every valid score is kept,
    # and then ``need`` is not used, as no key equals thr)
    need = K - _count_ge(s_ptr, row, N, tl.maximum(thr + 1, -2147483647), key0, valid0, BLOCK, SINGLE, KEY32)
    nsel = tl.minimum(nvalid, K)
    for j0 in range(0, W, BLOCK_K):  # -1 past the kept positions
        j = j0 + tl.arange(0, BLOCK_K)
        tl.store(orow + j, tl.full([BLOCK_K], -1, tl.int64), mask=(j < W) & (j >= nsel))
    base = 0
    ties = 0
    for c0 in range(0, N, BLOCK):
        cols = c0 + cols0
        if SINGLE:
            key, valid = key0, valid0
        else:
            key, valid = _keys(s_ptr, row, cols, N, KEY32)
        tie = valid & (key == thr)  # int64 compares here (thr may be below INT32_MIN): one pass
        tie_rank = ties + tl.cumsum(tie.to(tl.int32), axis=0) - 1
        sel = valid & ((key > thr) | (tie & (tie_rank < need)))
        slot = base + tl.cumsum(sel.to(tl.int32), axis=0) - 1
        tl.store(orow + slot, cols.to(tl.int64), mask=sel)
        base += tl.sum(sel.to(tl.int32), axis=0)
        ties += tl.sum(tie.to(tl.int32), axis=0)


def supports(scores: torch.Tensor, k: int) -> bool:
    return on_cuda(scores) and scores.dtype == torch.float32 and scores.dim() == 2


def topk_positions_triton(scores: torch.Tensor, k: int, force_kernel: bool = False,
                          warps: int | None = None, width: int | None = None,
                          bits: int | None = None) -> torch.Tensor:
    """``index.topk``: scores [T, N] fp32 (-inf = invalid) -> int64 [T, min(k, N)], the positions of the k
    largest valid scores (ties: lower position) in ascending position order, -1 padded.
    ``force_kernel`` runs the kernel on CPU tensors (Triton's interpreter, tests only); ``warps`` overrides the
    program's warp count and ``bits`` the bits a counting pass resolves (benchmarks; the counts are integers, so the
    result depends on neither); ``width`` (>= min(k, N); ``candidate_blocks_triton``) returns [T, width] rows, -1
    past the kept positions, written by the same launch instead of a concat."""
    if not (force_kernel or supports(scores, k)):
        return hand_off("index.topk", f"scores {scores.dtype} on {scores.device} not covered", topk_positions,
                        scores, k)
    if scores.dim() != 2:
        return topk_positions(scores, k)  # the reference's own error
    t, n = scores.shape
    kk = min(int(k), n)
    w = max(kk, int(width or 0))
    out = torch.empty(t, w, dtype=torch.long, device=scores.device)
    if t == 0 or kk <= 0:
        return out.fill_(-1)  # nothing to select: every slot past the (no) kept positions
    s = scores if scores.stride(1) == 1 else scores.contiguous()
    single = next_pow2(n) <= MAX_BLOCK
    block = next_pow2(n) if single else min(STREAM_BLOCK if RADIX_BITS > 1 else MAX_BLOCK, MAX_BLOCK)
    bits = bits or _bits_for(block)
    warps = warps or TOPK_WARPS or (8 if block >= 4096 or block << bits >= 8192 else 4)
    _topk_kernel[(t,)](s, out, n, kk, w, s.stride(0), BLOCK=block, SINGLE=single, BLOCK_K=min(1024, next_pow2(w)),
                       BITS=bits, EARLY=int(EARLY_EXIT), KEY32=int(KEY32), num_warps=warps,
                       **pdl_launch())
    return out


# -- index.candidate_blocks: block maxima, then the same select ---------------------------------------------


@triton.jit
def _block_max_kernel(s_ptr, vis_ptr, out_ptr, N, NB, stride_s, BS: tl.constexpr, BLOCK_B: tl.constexpr):
    """out [T, NB] fp32: the max of each ``BS``-wide block of a row of scores (-inf past N); +inf for the block
    holding the row's newest visible entry (``num_visible - 1``) when ``num_visible > 0``."""
    r = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)
    c = b[:, None] * BS + tl.arange(0, BS)[None, :]
    x = tl.load(s_ptr + r * stride_s + c, mask=(b[:, None] < NB) & (c < N), other=float("-inf"))
    m = tl.max(x, axis=1)
    nv = tl.load(vis_ptr + r).to(tl.int64)
    newest = tl.maximum(nv - 1, 0) // BS  # nv - 1 >= 0 where it counts: C division truncates toward zero
    m = tl.where((nv > 0) & (b == newest), float("inf"), m)
    tl.store(out_ptr + r * NB + b, m, mask=b < NB)


def supports_candidates(scores: torch.Tensor, num_visible: torch.Tensor, block_size: int, topk_blocks: int) -> bool:
    bs = int(block_size)
    return (on_cuda(scores, num_visible) and scores.dtype == torch.float32 and scores.dim() == 2
            and 0 < bs <= 1024 and bs & (bs - 1) == 0)


def candidate_blocks_triton(scores: torch.Tensor, num_visible: torch.Tensor, block_size: int, topk_blocks: int,
                            force_kernel: bool = False) -> torch.Tensor:
    """``index.candidate_blocks``: scores [T, N] fp32, num_visible [T] int -> int64 [T, topk_blocks], the ids of
    the best blocks (block score = max of its ``block_size`` scores; the newest visible entry's block forced
    first; -inf blocks never kept; ties to the lower id) as a set in ascending id order, -1 padded. Two launches,
    no sort and no host synchronisation. ``force_kernel``: CPU tensors in Triton's interpreter (tests only)."""
    if not force_kernel and not CANDIDATES_KERNEL:
        return candidate_blocks(scores, num_visible, block_size, topk_blocks)
    if not (force_kernel or supports_candidates(scores, num_visible, block_size, topk_blocks)):
        return hand_off("index.candidate_blocks", f"scores {scores.dtype} on {scores.device}, block {block_size} "
                        "not covered", candidate_blocks, scores, num_visible, block_size, topk_blocks)
    t, n = scores.shape
    bs, kb = int(block_size), int(topk_blocks)
    nb = triton.cdiv(n, bs)
    if t == 0 or nb == 0 or kb <= 0:
        return candidate_blocks(scores, num_visible, bs, kb)  # empty shapes: nothing to launch
    s = scores if scores.stride(1) == 1 else scores.contiguous()
    bmax = torch.empty(t, nb, dtype=torch.float32, device=scores.device)
    block_b = max(1, min(next_pow2(nb), 4096 // bs))
    _block_max_kernel[(t, triton.cdiv(nb, block_b))](s, num_visible.contiguous(), bmax, n, nb, s.stride(0), BS=bs,
                                                      BLOCK_B=block_b)
    # [T, kb] from the select's own launch: -1 past the kept blocks (no concat when there are fewer than kb)
    return topk_positions_triton(bmax, kb, force_kernel=force_kernel, width=kb)
