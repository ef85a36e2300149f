"""``gemm.fp8_block`` for fine scale blocks (DeepSeek-V4.1's [32, 32] UE8M0 "MXFP8" linears).

The general kernel of ``triton_gemm`` keeps one K tile inside one scale block, so with 32-wide scale blocks
every iteration moves a [BLOCK_N, 32] byte tile (2 KB at BLOCK_N 64) and issues a 16 x 32 dot: too little
work per iteration to keep enough bytes in flight, which is what decode is bound by (the sixth-pass profile:
~230 us per V4.1 layer of FP8 GEMMs at batch 1 where the ~167 MB of weights need ~40 us at 4.27 TB/s).

Here a K tile spans ``BLOCK_K / SUBK`` scale blocks: the weight bytes are loaded as
``[BLOCK_N, BLOCK_K / SUBK, SUBK]``, each scale block multiplied by its own scale (a [BLOCK_N, BLOCK_K / SUBK]
tile of scale bytes), rounded to x's dtype (the reference's rounding: exact for UE8M0 scales, whose products
with e4m3 values are representable in bf16), reshaped back to [BLOCK_N, BLOCK_K] and fed to one tensor-core
dot with fp32 accumulation. Split-K partials are summed in fixed order by ``triton_gemm.sum_slices``.

Numerics equal the general kernel's up to summation order (both are the reference up to summation order).
``triton_gemm.gemm_fp8_block`` sends a product here when x is bf16 / fp16 (fp32 activations keep the general
kernel's full-fp32 dot with its 32-wide K tiles), it has fewer than ``DEQUANT_ROWS`` rows, and the scale block
along K is a power of two narrower than ``FINE_TUNE["block_k"]``. The batch-invariant provider does not use it.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_nvidia.kernels.triton_scales import ue8m0

from deepinfer_nvidia.kernels._common import dot_precision

# block_k: K elements per iteration (a multiple of the scale block); block_n: output columns per program for
# up to 64 rows (128 above); programs: split-K aims for this many programs per SM-count (x SMs).
# H200 measurements in docs/performance.md (ninth pass); benchmarks may override.
FINE_TUNE: dict[str, int] = {"block_k": 128, "block_n": 64, "programs": 2, "warps": 4, "stages": 4}


@triton.jit
def _fp8_fine_kernel(x_ptr, q_ptr, s_ptr, y_ptr, M, N, K, stride_xm, s_cols, bn_blk, k_per_split, NG,
                     SUBK: tl.constexpr, SCALE_E8M0: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PREC: tl.constexpr):
    KB: tl.constexpr = BLOCK_K // SUBK
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    x_ptr += ((pid_n * BLOCK_N) // NG).to(tl.int64) * K  # grouped weights: this tile's group of x columns
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mmask = rm < M
    nmask = rn < N
    srow = (rn // bn_blk) * s_cols
    rsub = tl.arange(0, KB)
    rin = tl.arange(0, SUBK)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rm[:, None].to(tl.int64) * stride_xm + rk[None, :],
                    mask=mmask[:, None] & (rk < k_hi)[None, :], other=0.0)
        rk3 = k0 + rsub[:, None] * SUBK + rin[None, :]  # [KB, SUBK]
        w8 = tl.load(q_ptr + rn[:, None, None].to(tl.int64) * K + rk3[None, :, :],
                     mask=nmask[:, None, None] & (rk3 < k_hi)[None, :, :], other=0.0)
        smask = nmask[:, None] & ((k0 + rsub * SUBK) < k_hi)[None, :]
        sidx = srow[:, None] + (k0 // SUBK + rsub)[None, :]
        if SCALE_E8M0:
            sc = ue8m0(tl.load(s_ptr + sidx, mask=smask, other=127).to(tl.int32))
        else:
            sc = tl.load(s_ptr + sidx, mask=smask, other=1.0)
        w = (w8.to(tl.float32) * sc[:, :, None]).to(x.dtype)
        acc += tl.dot(x, tl.trans(tl.reshape(w, (BLOCK_N, BLOCK_K))), input_precision=PREC)
    if SPLIT_K == 1:
        tl.store(y_ptr + rm[:, None].to(tl.int64) * N + rn[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=mmask[:, None] & nmask[None, :])
    else:
        off = (pid_k * M + rm[:, None]).to(tl.int64) * N + rn[None, :]
        tl.store(y_ptr + off, acc, mask=mmask[:, None] & nmask[None, :])


# Smallest K for which the fine kernel is used: on the H200 (ninth pass) it won for K >= 2304 (wo_b 8192: 57 -> 42
# us at one row; shared-expert and wq_a shapes 3-9%) and lost for K = 1280 (wq_b: 32 -> 36 us).
FINE_MIN_K = 2048


def takes(x: torch.Tensor, bk_blk: int, m: int, k: int, dequant_rows: int) -> bool:
    """Whether this kernel serves a product: bf16/fp16 x, fewer than ``dequant_rows`` rows, K >= ``FINE_MIN_K``
    and a scale block along K that is a power of two narrower than ``FINE_TUNE["block_k"]``."""
    bk = FINE_TUNE["block_k"]
    return (x.dtype in (torch.bfloat16, torch.float16) and 0 < m < dequant_rows and k >= FINE_MIN_K
            and bk_blk < bk and bk_blk >= 16 and bk_blk & (bk_blk - 1) == 0 and bk % bk_blk == 0)


def fine_tiles(m: int, n: int, k: int, sms: int, block_k: int | None = None, block_n: int | None = None,
               programs: int | None = None) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K): split-K doubles while the grid has fewer than
    ``programs x sms`` programs and each split keeps >= 2 K iterations."""
    tune = FINE_TUNE
    bk = block_k or tune["block_k"]
    if m <= 16:
        bm, bn = 16, block_n or tune["block_n"]
    elif m <= 64:
        bm, bn = 64, block_n or tune["block_n"]
    else:
        bm, bn, bk = 128, 128, min(bk, 128)  # 128 x 256 tiles need more shared memory than an SM has
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    target = (programs or tune["programs"]) * sms
    k_iters = triton.cdiv(k, bk)
    split = 1
    while tiles * split < target and k_iters // (split * 2) >= 2 and split < 32:
        split *= 2
    return bm, bn, bk, split


def gemm_fp8_fine(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, s_cols: int, bn_blk: int, bk_blk: int,
                  e8: bool, sms: int, block_k: int | None = None, block_n: int | None = None,
                  programs: int | None = None, warps: int | None = None, stages: int | None = None,
                  ng: int | None = None) -> torch.Tensor:
    """y [M, N] (x.dtype) = x [M, K] @ dequant(q [N, K], s)^T; operands prepared by ``triton_gemm._prep_fp8``
    (x row-contiguous bf16/fp16, q e4m3 contiguous, s fp32 or UE8M0 bytes [ceil(N/bn), s_cols]). Keyword
    arguments: tuning knobs (defaults ``FINE_TUNE``); ``ng``: rows per weight group for the grouped op (x is
    then [M, (N/ng)*K] and group g reads its columns g*K ..; ng must be a multiple of the column tile)."""
    from deepinfer_nvidia.kernels.triton_gemm import _finish

    m, (n, k) = x.shape[0], q.shape
    bm, bn, bk, split = fine_tiles(m, n, k, sms, block_k, block_n, programs)
    k_per = triton.cdiv(triton.cdiv(k, split), bk) * bk
    split = triton.cdiv(k, k_per)
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn), split)
    y = torch.empty(m, n, dtype=x.dtype, device=x.device) if split == 1 else \
        torch.empty(split, m, n, dtype=torch.float32, device=x.device)
    nw = warps or (FINE_TUNE["warps"] if bm * bn <= 64 * 64 else 8)
    ns = stages or (FINE_TUNE["stages"] if bm < 128 else 3)
    _fp8_fine_kernel[grid](x, q, s, y, m, n, k, x.stride(0), s_cols, bn_blk, k_per, ng or n, SUBK=bk_blk, SCALE_E8M0=e8,
                           SPLIT_K=split, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, PREC=dot_precision(x.dtype),
                           num_warps=nw, num_stages=ns)
    return y if split == 1 else _finish(y, m, n, x.dtype)
