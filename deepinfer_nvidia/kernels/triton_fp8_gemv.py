"""``gemm.fp8_block`` for a few rows (decode): a GEMV on the CUDA cores, no tensor-core dot.

The H200 profile of a graphed V4.1 batch-1 decode step (ninth pass) put the tensor-core FP8 kernels at
~20% of the copy bandwidth there. At 1-4 rows a 16-row ``tl.dot`` tile is mostly padding, and each weight
tile makes a register -> shared-memory -> MMA-operand round trip. Here one program owns (one row of x, a
column tile, a K range). It loads the weight bytes as ``[BLOCK_N, BLOCK_K / SUBK, SUBK]`` (SUBK: the scale
block along K, or the whole tile when the scale block is wider), converts e4m3 to fp32, multiplies by the x
row (fp32), and sums each scale block before multiplying it by its scale once. The grid's first axis is the
row, so the programs of one weight tile run next to each other and rows after the first read it from L2.

Numerics: the reference rounds ``q * scale`` to x's dtype and multiplies. For UE8M0 (power-of-two) scales that
rounding is exact and ``(q * x) * scale`` gives the same fp32 products, so only the summation order differs.
For fp32 scales the product is rounded once more. Split-K partials are summed in fixed order
(``triton_gemm.sum_slices``). The path is used only by the default ``triton`` provider, below
``GEMV_TUNE["rows"]`` rows, so its bits depend on the row count: it is not batch-invariant. The ``triton_bi``
provider keeps its single tiling.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_nvidia.kernels.triton_scales import ue8m0
from deepinfer_nvidia.kernels.cuda_side_stream import lane

# block_n x block_k weight tile per iteration, programs per SM to aim for with split-K, warps, stages, and the
# largest row count served here (the tensor-core kernels above it). H200: docs/performance.md (ninth pass).
# fold: the split-K partials are summed by the last program of each column tile (one launch instead of two).
# min_iters: K tiles per split-K program at least (the split stops doubling below it).
GEMV_TUNE: dict[str, int] = {"block_n": 32, "block_k": 256, "programs": 4, "warps": 4, "stages": 3, "rows": 2,
                             "fold": 1, "min_iters": 2}

# Arrival counters of the folded split-K sum, per (device, lane): zero between launches (each launch's last programs
# reset theirs). Launches on one stream run one after another; a ``stream.side`` branch (``cuda_side_stream``) runs
# in lane 1, so its launches never share counters with those in flight on the stream that forked it.
_COUNTERS: dict[tuple[torch.device, int], torch.Tensor] = {}


def _counters(device: torch.device, n: int) -> torch.Tensor:
    key = (device, lane())
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < n:
        buf = _COUNTERS[key] = torch.zeros(max(n, 1 << 16), dtype=torch.int32, device=device)
    return buf


@triton.jit
def _fp8_gemv_kernel(x_ptr, q_ptr, s_ptr, y_ptr, part_ptr, cnt_ptr, M, N, K, stride_xm, s_cols, bn_blk, bk_blk,
                     k_per_split, NG, SUBK: tl.constexpr, SCALE_E8M0: tl.constexpr, SPLIT_K: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FOLD: tl.constexpr):
    KB: tl.constexpr = BLOCK_K // SUBK
    row = tl.program_id(0).to(tl.int64)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    # grouped weights: this column tile's group reads x columns g*K .. (g+1)*K (NG = N: one group)
    x_row = x_ptr + row * stride_xm + ((pid_n * BLOCK_N) // NG).to(tl.int64) * K
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rn < N
    srow = (rn // bn_blk) * s_cols
    rsub = tl.arange(0, KB)
    rin = tl.arange(0, SUBK)
    acc = tl.zeros([BLOCK_N, KB], dtype=tl.float32)
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        rk3 = k0 + rsub[:, None] * SUBK + rin[None, :]  # [KB, SUBK]
        km = rk3 < k_hi
        xv = tl.load(x_row + rk3, mask=km, other=0.0).to(tl.float32)
        w8 = tl.load(q_ptr + rn[:, None, None].to(tl.int64) * K + rk3[None, :, :],
                     mask=nmask[:, None, None] & km[None, :, :], other=0.0)
        part = tl.sum(w8.to(tl.float32) * xv[None, :, :], axis=2)  # [BLOCK_N, KB]: one sum per scale block
        kb0 = k0 + rsub * SUBK
        sidx = srow[:, None] + (kb0 // bk_blk)[None, :]
        smask = nmask[:, None] & (kb0 < k_hi)[None, :]
        if SCALE_E8M0:
            sc = ue8m0(tl.load(s_ptr + sidx, mask=smask, other=127).to(tl.int32))
        else:
            sc = tl.load(s_ptr + sidx, mask=smask, other=1.0)
        acc += part * sc
    out = tl.sum(acc, axis=1)
    if SPLIT_K == 1:
        tl.store(y_ptr + row * N + rn, out.to(y_ptr.dtype.element_ty), mask=nmask)
    elif FOLD:
        # split-K partial, then the last program of this (row, column tile) to arrive sums all partials in split
        # order (the bits of ``sum_slices``) and resets its counter for the next launch (CUDA-graph replays)
        tl.store(part_ptr + (pid_k * M + row) * N + rn, out, mask=nmask)
        tl.debug_barrier()  # every thread's partial is stored before the arrival is counted
        cnt = cnt_ptr + row * tl.num_programs(1) + pid_n
        if tl.atomic_add(cnt, 1, sem="acq_rel") == SPLIT_K - 1:
            total = tl.zeros([BLOCK_N], dtype=tl.float32)
            for sk in range(SPLIT_K):
                total += tl.load(part_ptr + (sk * M + row) * N + rn, mask=nmask, other=0.0, cache_modifier=".cg")
            tl.store(y_ptr + row * N + rn, total.to(y_ptr.dtype.element_ty), mask=nmask)
            tl.atomic_xchg(cnt, 0)
    else:
        tl.store(part_ptr + (pid_k * M + row) * N + rn, out, mask=nmask)


def takes(m: int, bk_blk: int) -> bool:
    """Whether a product of ``m`` rows with scale blocks ``bk_blk`` wide along K goes to this kernel (default
    provider only): a few rows, and scale blocks that tile the K tile (a power of two from 16 up to it) or
    that it tiles (a multiple of it)."""
    bk = GEMV_TUNE["block_k"]
    pow2 = bk_blk >= 16 and bk_blk & (bk_blk - 1) == 0
    return 0 < m <= GEMV_TUNE["rows"] and ((pow2 and bk_blk <= bk) or bk_blk % bk == 0)


def gemv_block_n(block_n: int | None = None) -> int:
    """The column tile (the grouped op needs rows per group to be a multiple of it)."""
    return block_n or GEMV_TUNE["block_n"]


def gemm_fp8_gemv(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, s_cols: int, bn_blk: int, bk_blk: int,
                  e8: bool, sms: int, block_n: int | None = None, block_k: int | None = None,
                  programs: int | None = None, warps: int | None = None, stages: int | None = None,
                  ng: int | None = None, fold: int | None = None, min_iters: int | None = None) -> torch.Tensor:
    """y [M, N] (x.dtype) = x [M, K] @ dequant(q [N, K], s)^T for a few rows; operands prepared by
    ``triton_gemm._prep_fp8`` (x row-contiguous, q e4m3 contiguous, s fp32 or UE8M0 bytes [ceil(N/bn), s_cols]).
    ``ng``: rows per weight group (grouped op; a multiple of the column tile). Keyword arguments: tuning knobs
    (defaults ``GEMV_TUNE``)."""
    from deepinfer_nvidia.kernels.triton_gemm import _finish

    tune = GEMV_TUNE
    m, (n, k) = x.shape[0], q.shape
    bn = gemv_block_n(block_n)
    bk = block_k or tune["block_k"]
    if not ((bk_blk <= bk and bk % bk_blk == 0 and bk_blk & (bk_blk - 1) == 0) or bk_blk % bk == 0):
        raise ValueError(f"scale blocks {bk_blk} wide neither tile nor are tiled by K tiles of {bk}")
    subk = min(bk_blk, bk)  # several scale blocks per K tile, or one scale block over the whole tile
    tiles = m * triton.cdiv(n, bn)
    k_iters = triton.cdiv(k, bk)
    split = 1
    min_iters = min_iters or tune["min_iters"]
    while tiles * split < (programs or tune["programs"]) * sms and k_iters // (split * 2) >= min_iters and split < 32:
        split *= 2
    k_per = triton.cdiv(triton.cdiv(k, split), bk) * bk
    split = triton.cdiv(k, k_per)
    fold = tune["fold"] if fold is None else fold
    nt = triton.cdiv(n, bn)
    y = torch.empty(m, n, dtype=x.dtype, device=x.device) if split == 1 or fold else None
    part = torch.empty(split, m, n, dtype=torch.float32, device=x.device) if split > 1 else y
    cnt = _counters(x.device, m * nt) if split > 1 and fold else part  # (unused when not folding)
    _fp8_gemv_kernel[(m, nt, split)](x, q, s, y if y is not None else part, part, cnt, m, n, k, x.stride(0), s_cols,
                                     bn_blk, bk_blk, k_per, ng or n, SUBK=subk, SCALE_E8M0=e8, SPLIT_K=split,
                                     BLOCK_N=bn, BLOCK_K=bk, FOLD=int(bool(fold)), num_warps=warps or tune["warps"],
                                     num_stages=stages or tune["stages"])
    return y if y is not None else _finish(part, m, n, x.dtype)
