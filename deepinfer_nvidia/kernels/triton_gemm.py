"""Triton GEMMs over quantised weights: ``gemm.fp8_block`` and ``gemm.mxfp4``.

Both compute ``y [T, N] = x [T, K] @ W^T`` with W dequantised tile by tile
inside the kernel (first version: dequantise to x's dtype, then a bf16/fp16
tensor-core ``tl.dot`` with fp32 accumulation; fp32 activations use full-fp32
dots). The weight is read once per output column tile in its stored form
(1 byte per element for FP8, half a byte for MXFP4), which is what decode is
bound by. This reproduces the reference's numerics exactly up to summation
order: the reference also rounds the dequantised weight to x.dtype before the
product (exact for UE8M0 and MXFP4 scales, one rounding for fp32 scales).

FP8 block scales: ``scale[n // bn, k // bk]`` fp32 or UE8M0 (raw bytes ``b``
meaning ``2^(b-127)``); K tiles never straddle a scale block (``BLOCK_K``
divides ``bk``). MXFP4: byte ``j`` of a row holds elements ``2j`` (low nibble)
and ``2j+1`` (high nibble), one UE8M0 scale per 32 elements.

Small T (decode) uses split-K: ``SPLIT_K`` programs share a column tile, each
summing a K range into fp32 partials that one reduction sums in fixed order,
so the weight read is spread over enough SMs to reach the memory bandwidth.

Batch-invariant variants (provider ``triton_bi``: ``gemm_fp8_block_bi``,
``gemm_mxfp4_bi``, ``gemm_dense_bi``): the default launch picks its tile shape
and split-K from the row count M and switches to dequant + cuBLAS at
``DEQUANT_ROWS``, so a row's bits depend on the batch. The variants run one
tile shape (``BI_BLOCK_M`` x ``BI_BLOCK_N`` x a K tile fixed per dtype) for
every M and take split-K from (N, K) alone: each row then goes through the same
dot instructions over the same K ranges in the same order, and the split
partials are summed in fixed order (``sum_slices``), whatever else is in the call.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_core.kernels.ops.gemm import _check_x, check_dense_wide, dense, dense_wide, fp8_block, mxfp4, wide_dtype
from deepinfer_core.kernels.ops.quant import MXFP4_GROUP, QuantFormatError, fp8_block_scale_shape
from deepinfer_nvidia.kernels import gluon_fp8_gemv, gluon_w8a8_gemv, triton_fp8_fine, triton_fp8_gemv
from deepinfer_nvidia.kernels.triton_scales import ue8m0
from deepinfer_nvidia.kernels._common import FLOATS, dot_precision, hand_off, on_cuda
from deepinfer_nvidia.kernels.triton_pdl import pdl_enter, pdl_launch
from deepinfer_nvidia.kernels.wide_copies import widened

_SMS = 132  # H200; only used to size split-K, a wrong value costs speed, never correctness


_SM_CACHE: dict = {}


def _sm_count(device) -> int:
    """Multiprocessor count of ``device`` (cached: the query costs microseconds per call)."""
    n = _SM_CACHE.get(device)
    if n is None:
        try:
            n = torch.cuda.get_device_properties(device).multi_processor_count
        except Exception:  # noqa: BLE001 - only a sizing hint
            n = _SMS
        _SM_CACHE[device] = n
    return n


_ue8m0 = ue8m0  # the name the MoE kernel modules import


@triton.jit
def _tile(M, N, K, k_per_split, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """This program's output tile and K range (grid: M tiles, N tiles, K splits): rows ``rm [BLOCK_M]``, columns
    ``rn [BLOCK_N]``, their masks, and ``k_lo .. k_hi``."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    k_lo = tl.program_id(2) * k_per_split
    return rm, rn, rm < M, rn < N, k_lo, tl.minimum(k_lo + k_per_split, K)


@triton.jit
def _x_tile(x_ptr, rm, rk, mmask, kmask, stride_xm):
    """Activations ``x[rm, rk]`` (zero outside the masks)."""
    return tl.load(x_ptr + rm[:, None].to(tl.int64) * stride_xm + rk[None, :], mask=mmask[:, None] & kmask[None, :],
                   other=0.0)


@triton.jit
def _store_tile(y_ptr, acc, rm, rn, mmask, nmask, M, N, stride_ym, SPLIT_K: tl.constexpr):
    """SPLIT_K 1: ``y [M, N]`` in y's dtype; else this split's fp32 partials, slice ``program_id(2)`` of
    ``y [SPLIT_K, M, N]`` (``_finish`` sums them)."""
    if SPLIT_K == 1:
        tl.store(y_ptr + rm[:, None].to(tl.int64) * stride_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=mmask[:, None] & nmask[None, :])
    else:
        off = (tl.program_id(2) * M + rm[:, None]).to(tl.int64) * N + rn[None, :]
        tl.store(y_ptr + off, acc, mask=mmask[:, None] & nmask[None, :])


@triton.jit
def _fp8_gemm_kernel(x_ptr, q_ptr, s_ptr, y_ptr, M, N, K, stride_xm, stride_ym, s_cols, bn_blk, bk_blk, k_per_split,
                     NG, SCALE_E8M0: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, PREC: tl.constexpr):
    # grouped weights (``gemm.fp8_block_grouped``): the column tile's group reads x columns g*K .. (g+1)*K;
    # NG (rows per group) is N when there is one group, so g is 0
    x_ptr += ((tl.program_id(1) * BLOCK_N) // NG).to(tl.int64) * K
    rm, rn, mmask, nmask, k_lo, k_hi = _tile(M, N, K, k_per_split, BLOCK_M, BLOCK_N)
    srow = (rn // bn_blk) * s_cols
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        kmask = rk < k_hi
        x = _x_tile(x_ptr, rm, rk, mmask, kmask, stride_xm)
        w8 = tl.load(q_ptr + rn[:, None].to(tl.int64) * K + rk[None, :], mask=nmask[:, None] & kmask[None, :],
                     other=0.0)
        if SCALE_E8M0:
            sc = _ue8m0(tl.load(s_ptr + srow + k0 // bk_blk, mask=nmask, other=127).to(tl.int32))
        else:
            sc = tl.load(s_ptr + srow + k0 // bk_blk, mask=nmask, other=1.0)
        w = (w8.to(tl.float32) * sc[:, None]).to(x.dtype)
        acc += tl.dot(x, tl.trans(w), input_precision=PREC)
    _store_tile(y_ptr, acc, rm, rn, mmask, nmask, M, N, stride_ym, SPLIT_K)


@triton.jit
def _mxfp4_gemm_kernel(x_ptr, p_ptr, s_ptr, y_ptr, M, N, K, stride_xm, stride_ym, k_per_split,
                       SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       PREC: tl.constexpr):
    rm, rn, mmask, nmask, k_lo, k_hi = _tile(M, N, K, k_per_split, BLOCK_M, BLOCK_N)
    HALF: tl.constexpr = BLOCK_K // 2
    GROUPS: tl.constexpr = BLOCK_K // 32
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        kmask = rk < k_hi
        x = _x_tile(x_ptr, rm, rk, mmask, kmask, stride_xm)
        rj = k0 // 2 + tl.arange(0, HALF)
        byte = tl.load(p_ptr + rn[:, None].to(tl.int64) * (K // 2) + rj[None, :],
                       mask=nmask[:, None] & (rj[None, :] < k_hi // 2), other=0).to(tl.int32)
        # e2m1 code c: sign c>>3, exponent (c>>1)&3, mantissa c&1; value (1+m/2)*2^(e-1), or m/2 when e == 0
        codes = tl.join(byte & 0xF, (byte >> 4) & 0xF)  # [BN, HALF, 2]: element 2j, then 2j+1
        codes = tl.reshape(codes, [BLOCK_N, BLOCK_K])
        e = (codes >> 1) & 3
        m = (codes & 1).to(tl.float32)
        mag = tl.where(e == 0, 0.5 * m, (1.0 + 0.5 * m) * (1 << tl.maximum(e - 1, 0)).to(tl.float32))
        val = tl.where((codes & 8) != 0, -mag, mag)
        rg = k0 // 32 + tl.arange(0, GROUPS)
        sb = tl.load(s_ptr + rn[:, None].to(tl.int64) * (K // 32) + rg[None, :],
                     mask=nmask[:, None] & (rg[None, :] < k_hi // 32), other=127).to(tl.int32)
        sc = _ue8m0(sb)  # [BN, GROUPS]
        sc = tl.reshape(tl.broadcast_to(sc[:, :, None], [BLOCK_N, GROUPS, 32]), [BLOCK_N, BLOCK_K])
        w = (val * sc).to(x.dtype)
        acc += tl.dot(x, tl.trans(w), input_precision=PREC)
    _store_tile(y_ptr, acc, rm, rn, mmask, nmask, M, N, stride_ym, SPLIT_K)


def _tiles(m: int, n: int, k: int, dtype: torch.dtype, device, k_align: int):
    """(BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, warps, stages) for an [M, K] x [N, K]^T product."""
    fp32 = dtype == torch.float32
    if m <= 16:
        bm, bn = 16, 64
    elif m <= 64:
        bm, bn = 64, 64
    else:
        bm, bn = 128, 128
    bk = 32 if fp32 else 128
    bk = min(bk, k_align)
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    split = 1
    k_blocks = triton.cdiv(k, bk)
    sms = _sm_count(device)
    while tiles * split < sms and k_blocks // (split * 2) >= 4 and split < 16:
        split *= 2
    warps = 4 if bm * bn <= 64 * 64 else 8
    stages = 3 if (fp32 or bm >= 128) else 4
    return bm, bn, bk, split, warps, stages


@triton.jit
def _sum_slices_kernel(src_ptr, dst_ptr, N, S, stride_s, stride_m, BLOCK: tl.constexpr, PDL: tl.constexpr = 0):
    """dst[m, n] = sum_{s < S} src[s * stride_s + m * stride_m + n] (fp32, s in order), cast to dst's dtype."""
    pdl_enter(PDL)
    m = tl.program_id(0).to(tl.int64)
    rn = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = rn < N
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(S):
        acc += tl.load(src_ptr + s * stride_s + m * stride_m + rn, mask=mask, other=0.0)
    tl.store(dst_ptr + m * N + rn, acc.to(dst_ptr.dtype.element_ty), mask=mask)


def sum_slices(src: torch.Tensor, m: int, n: int, s: int, stride_s: int, stride_m: int,
               dtype: torch.dtype) -> torch.Tensor:
    """One launch: ``[M, N]`` in ``dtype`` = fixed-order fp32 sum of ``s`` slices of the fp32 ``src``
    (element (m, n) of slice i at ``i * stride_s + m * stride_m + n``)."""
    out = torch.empty(m, n, dtype=dtype, device=src.device)
    if m and n:
        block = min(1024, max(128, 1 << (int(n) - 1).bit_length()))
        _sum_slices_kernel[(m, triton.cdiv(n, block))](src, out, n, s, stride_s, stride_m, BLOCK=block,
                                                       num_warps=4, **pdl_launch())
    return out


def _finish(part: torch.Tensor, m: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    """Sum split-K partials [S, M, N] (fp32) in fixed order and cast: one launch."""
    return sum_slices(part, m, n, part.shape[0], m * n, n, dtype)


def _split_plan(x: torch.Tensor, n: int, k: int, bm: int, bn: int, bk: int, split: int):
    """(grid, K columns a split, split count, output) of a split-K launch over x [M, K] and N columns: the K range a
    split takes is rounded up to whole ``bk`` tiles (so fewer splits may remain), and the output is y [M, N] in x's
    dtype at one split, else the fp32 partials [S, M, N] that ``_finish`` sums."""
    m = x.shape[0]
    k_per = triton.cdiv(triton.cdiv(k, split), bk) * bk
    split = triton.cdiv(k, k_per)
    y = torch.empty(m, n, dtype=x.dtype, device=x.device) if split == 1 else \
        torch.empty(split, m, n, dtype=torch.float32, device=x.device)
    return (triton.cdiv(m, bm), triton.cdiv(n, bn), split), k_per, split, y


@triton.jit
def _fp8_dequant_kernel(q_ptr, s_ptr, w_ptr, N, K, s_cols, bn_blk, bk_blk, SCALE_E8M0: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """w [N, K] (x dtype) = q * scale[n // bn, k // bk]: one pass, 1 byte read + 2 written per element."""
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask = (rn[:, None] < N) & (rk[None, :] < K)
    sidx = (rn[:, None] // bn_blk) * s_cols + rk[None, :] // bk_blk
    if SCALE_E8M0:
        sc = _ue8m0(tl.load(s_ptr + sidx, mask=mask, other=127).to(tl.int32))
    else:
        sc = tl.load(s_ptr + sidx, mask=mask, other=1.0)
    off = rn[:, None].to(tl.int64) * K + rk[None, :]
    w = tl.load(q_ptr + off, mask=mask, other=0.0).to(tl.float32) * sc
    tl.store(w_ptr + off, w.to(w_ptr.dtype.element_ty), mask=mask)


def _dequant_fp8(q, s, s_cols, bn_blk, bk_blk, e8, dtype) -> torch.Tensor:
    """w [N, K] in ``dtype`` = the block-scaled e4m3 weight, one pass (prefill-sized products)."""
    n, k = q.shape
    w = torch.empty(n, k, dtype=dtype, device=q.device)
    _fp8_dequant_kernel[(triton.cdiv(n, 64), triton.cdiv(k, 128))](q, s, w, n, k, s_cols, bn_blk, bk_blk,
                                                                  SCALE_E8M0=e8, BLOCK_N=64, BLOCK_K=128, num_warps=4)
    return w


# Rows from which a prefill-sized product dequantises the weight once and runs cuBLAS:
# measured on the H200 (docs/performance.md), the in-kernel-dequant bf16 dot reached
# 230-260 TFLOP/s at T=1024 where cuBLAS reaches ~700 on the same shapes.
DEQUANT_ROWS = 512


# -- gemm.fp8_block --------------------------------------------------------------------
def supports_fp8(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, block) -> bool:
    """CUDA x (fp32/bf16/fp16) with an e4m3 q and fp32 or UE8M0 scales; block bk a multiple of 16."""
    if not on_cuda(x, q, scale) or x.dtype not in FLOATS or q.dtype != torch.float8_e4m3fn:
        return False
    if scale.dtype not in (torch.float32, torch.float8_e8m0fnu, torch.uint8):
        return False
    try:
        bn, bk = int(block[0]), int(block[1])
    except (TypeError, ValueError, IndexError):
        return False
    return bk % 16 == 0 and bn > 0


def _prep_fp8(x, q, scale, block):
    """Validate (the reference's errors) and lay out the operands: (x, q, s, scale cols, bn, bk, UE8M0?)."""
    if q.dim() != 2:
        raise ValueError(f"gemm.fp8_block: q must be [N, K], got shape {tuple(q.shape)}")
    _check_x(x, q.shape[1], "gemm.fp8_block")
    n, k = q.shape
    bn_blk, bk_blk = int(block[0]), int(block[1])
    want = fp8_block_scale_shape(n, k, (bn_blk, bk_blk))
    if tuple(scale.shape) != want:
        raise QuantFormatError(f"fp8 block scale for weight [{n}, {k}] with block ({bn_blk}, {bk_blk}) must have "
                               f"shape {list(want)}, got {list(scale.shape)}")
    x = x if x.stride(1) == 1 else x.contiguous()
    s = (scale.view(torch.uint8) if scale.dtype == torch.float8_e8m0fnu else scale).contiguous()
    return x, q.contiguous(), s, want[1], bn_blk, bk_blk, scale.dtype != torch.float32


def _launch_fp8(x, q, s, s_cols, bn_blk, bk_blk, e8, tiles, ng: int | None = None) -> torch.Tensor:
    """One launch of the general kernel (+ the split-K sum); ``ng``: rows per weight group (grouped op, a
    multiple of the column tile), default N (one group)."""
    m, (n, k) = x.shape[0], q.shape
    bm, bn, bk, split, warps, stages = tiles
    grid, k_per, split, y = _split_plan(x, n, k, bm, bn, bk, split)
    _fp8_gemm_kernel[grid](x, q, s, y, m, n, k, x.stride(0), n, s_cols, bn_blk, bk_blk, k_per, ng or n,
                           SCALE_E8M0=e8, SPLIT_K=split, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                           PREC=dot_precision(x.dtype), num_warps=warps, num_stages=stages)
    return y if split == 1 else _finish(y, m, n, x.dtype)


def gemm_fp8_block(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, block) -> torch.Tensor:
    """``gemm.fp8_block``: x [T, K] @ dequant(q [N, K], scale)^T -> [T, N] in x.dtype."""
    if not supports_fp8(x, q, scale, block):
        return hand_off("gemm.fp8_block", f"operands x {x.dtype} q {q.dtype} scale {scale.dtype} on {x.device} "
                        f"block {block!r} not covered", fp8_block, x, q, scale, block)
    x, q, s, s_cols, bn_blk, bk_blk, e8 = _prep_fp8(x, q, scale, block)
    m, (n, k) = x.shape[0], q.shape
    if m == 0:
        return x.new_zeros(0, n)
    if m >= DEQUANT_ROWS and x.dtype != torch.float32:
        return x @ _dequant_fp8(q, s, s_cols, bn_blk, bk_blk, e8, x.dtype).t()
    if gluon_w8a8_gemv.takes(x, q, bn_blk, bk_blk, e8):  # opt-in MXFP8 activations: FP8 wgmma (thirty-fifth pass)
        return gluon_w8a8_gemv.gemv_w8a8(x, q, s, s_cols, bn_blk, bk_blk, _sm_count(x.device))
    if gluon_fp8_gemv.takes(x, q, bn_blk, bk_blk, e8):  # 1-16 rows on SM90: swap-AB wgmma (twelfth pass)
        return gluon_fp8_gemv.gemv_wgmma(x, q, s, s_cols, bn_blk, bk_blk, _sm_count(x.device))
    if triton_fp8_gemv.takes(m, bk_blk):  # decode: a CUDA-core GEMV, no 16-row tensor-core tile of padding
        return triton_fp8_gemv.gemm_fp8_gemv(x, q, s, s_cols, bn_blk, bk_blk, e8, _sm_count(x.device))
    if triton_fp8_fine.takes(x, bk_blk, m, k, DEQUANT_ROWS):  # V4.1's [32, 32] blocks: K tiles over 4 scale blocks
        return triton_fp8_fine.gemm_fp8_fine(x, q, s, s_cols, bn_blk, bk_blk, e8, _sm_count(x.device))
    return _launch_fp8(x, q, s, s_cols, bn_blk, bk_blk, e8, _tiles(m, n, k, x.dtype, x.device, bk_blk & -bk_blk))


# -- gemm.fp8_block_grouped -------------------------------------------------------------
def supports_fp8_grouped(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, block, groups) -> bool:
    """``supports_fp8`` for the grouped op (the group count itself is checked by the op)."""
    return supports_fp8(x, q, scale, block)


def _grouped_operands(x, q, scale, block, groups):
    """The reference's checks, then (x, q, s, s_cols, bn_blk, bk_blk, e8, G, Ng) with q's K = Kg."""
    from deepinfer_core.kernels.ops.gemm import fp8_block_grouped

    g = int(groups)
    if q.dim() != 2 or g < 1 or q.shape[0] % g or (q.shape[0] // g) % int(block[0]) or x.dim() != 2 \
            or x.shape[1] != g * q.shape[1]:
        fp8_block_grouped(x, q, scale, block, groups)  # raises the reference's error
    x = x if x.stride(1) == 1 else x.contiguous()
    xs, q, s, s_cols, bn_blk, bk_blk, e8 = _prep_fp8(x[:, :q.shape[1]], q, scale, block)
    return x, q, s, s_cols, bn_blk, bk_blk, e8, g, q.shape[0] // g


def _grouped_loop(fn, x, q, scale, block, g):
    """Column group by column group through ``fn`` (gemm.fp8_block), concatenated: the unfused form."""
    ng, kg, sb = q.shape[0] // g, q.shape[1], q.shape[0] // g // int(block[0])
    return torch.cat([fn(x[:, i * kg:(i + 1) * kg], q[i * ng:(i + 1) * ng], scale[i * sb:(i + 1) * sb], block)
                      for i in range(g)], dim=-1)


def gemm_fp8_block_grouped(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, block, groups: int) -> torch.Tensor:
    """``gemm.fp8_block_grouped``: x [T, G*Kg], q [G*Ng, Kg] e4m3 -> [T, G*Ng] in x.dtype, one launch (+ the
    split-K sum) for all G groups below ``DEQUANT_ROWS`` rows; one dequantisation + one batched cuBLAS GEMM
    above. Column tiles never straddle a group (Ng a multiple of the tile, else the per-group loop)."""
    from deepinfer_core.kernels.ops.gemm import fp8_block_grouped

    if not supports_fp8(x, q, scale, block):
        return hand_off("gemm.fp8_block_grouped", f"operands x {x.dtype} q {q.dtype} scale {scale.dtype} on "
                        f"{x.device} block {block!r} not covered", fp8_block_grouped, x, q, scale, block, groups)
    x, q, s, s_cols, bn_blk, bk_blk, e8, g, ng = _grouped_operands(x, q, scale, block, groups)
    m, (n, k) = x.shape[0], q.shape
    if m == 0:
        return x.new_zeros(0, n)
    if m >= DEQUANT_ROWS and x.dtype != torch.float32:
        w = _dequant_fp8(q, s, s_cols, bn_blk, bk_blk, e8, x.dtype)
        y = torch.bmm(x.view(m, g, k).transpose(0, 1), w.view(g, ng, k).transpose(1, 2))  # [G, T, Ng]
        return y.transpose(0, 1).reshape(m, n)
    sms = _sm_count(x.device)
    if gluon_w8a8_gemv.takes(x, q, bn_blk, bk_blk, e8, ng=ng):
        return gluon_w8a8_gemv.gemv_w8a8(x, q, s, s_cols, bn_blk, bk_blk, sms, ng=ng)
    if gluon_fp8_gemv.takes(x, q, bn_blk, bk_blk, e8, ng=ng):
        return gluon_fp8_gemv.gemv_wgmma(x, q, s, s_cols, bn_blk, bk_blk, sms, ng=ng)
    if triton_fp8_gemv.takes(m, bk_blk):
        if ng % triton_fp8_gemv.gemv_block_n() == 0:
            return triton_fp8_gemv.gemm_fp8_gemv(x, q, s, s_cols, bn_blk, bk_blk, e8, sms, ng=ng)
    elif triton_fp8_fine.takes(x, bk_blk, m, k, DEQUANT_ROWS):
        if ng % triton_fp8_fine.fine_tiles(m, n, k, sms)[1] == 0:
            return triton_fp8_fine.gemm_fp8_fine(x, q, s, s_cols, bn_blk, bk_blk, e8, sms, ng=ng)
    else:
        tiles = _tiles(m, n, k, x.dtype, x.device, bk_blk & -bk_blk)
        if ng % tiles[1] == 0:
            return _launch_fp8(x, q, s, s_cols, bn_blk, bk_blk, e8, tiles, ng=ng)
    return _grouped_loop(gemm_fp8_block, x, q, scale, block, g)


def gemm_fp8_block_grouped_bi(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, block,
                              groups: int) -> torch.Tensor:
    """``gemm.fp8_block_grouped``, batch-invariant: one launch with the tiling ``gemm_fp8_block_bi`` uses for
    one group's [Ng, Kg] weight (split-K from (Ng, Kg)), so every output element has the bits of the per-group
    batch-invariant GEMM, whatever T is."""
    from deepinfer_core.kernels.ops.gemm import fp8_block_grouped

    if not supports_fp8(x, q, scale, block):
        return hand_off("gemm.fp8_block_grouped[bi]", f"operands x {x.dtype} q {q.dtype} scale {scale.dtype} on "
                        f"{x.device} block {block!r} not covered", fp8_block_grouped, x, q, scale, block, groups)
    x, q, s, s_cols, bn_blk, bk_blk, e8, g, ng = _grouped_operands(x, q, scale, block, groups)
    if x.shape[0] == 0:
        return x.new_zeros(0, q.shape[0])
    tiles = bi_tiles(ng, q.shape[1], x.dtype, bk_blk & -bk_blk)
    if ng % tiles[1]:
        return _grouped_loop(gemm_fp8_block_bi, x, q, scale, block, g)
    return _launch_fp8(x, q, s, s_cols, bn_blk, bk_blk, e8, tiles, ng=ng)


# -- gemm.mxfp4 ------------------------------------------------------------------------
def supports_mxfp4(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor) -> bool:
    """CUDA x (fp32/bf16/fp16), packed uint8/int8 [N, K/2], UE8M0 scale [N, K/32]."""
    return (on_cuda(x, packed, scale) and x.dtype in FLOATS and packed.dtype in (torch.uint8, torch.int8)
            and scale.dtype in (torch.float8_e8m0fnu, torch.uint8))


def _prep_mxfp4(x, packed, scale):
    """Validate (the reference's errors) and lay out the operands: (x, packed bytes, scale bytes)."""
    if packed.dim() != 2:
        raise ValueError(f"gemm.mxfp4: packed must be [N, K/2], got shape {tuple(packed.shape)}")
    _check_x(x, 2 * packed.shape[1], "gemm.mxfp4")
    n, half = packed.shape
    k = 2 * half
    if k % MXFP4_GROUP or tuple(scale.shape) != (n, k // MXFP4_GROUP):
        raise QuantFormatError(f"MXFP4 scale for packed [{n}, {half}] (K={k}) must have shape "
                               f"[{n}, {k // MXFP4_GROUP}] with K divisible by {MXFP4_GROUP}, got {list(scale.shape)}")
    x = x if x.stride(1) == 1 else x.contiguous()
    return x, packed.view(torch.uint8).contiguous(), scale.view(torch.uint8).contiguous()


def _launch_mxfp4(x, p, s, tiles) -> torch.Tensor:
    m, n, k = x.shape[0], p.shape[0], 2 * p.shape[1]
    bm, bn, bk, split, warps, stages = tiles
    bk = max(bk, 32)  # one scale group at least
    grid, k_per, split, y = _split_plan(x, n, k, bm, bn, bk, split)
    _mxfp4_gemm_kernel[grid](x, p, s, y, m, n, k, x.stride(0), n, k_per, SPLIT_K=split, BLOCK_M=bm, BLOCK_N=bn,
                             BLOCK_K=bk, PREC=dot_precision(x.dtype), num_warps=warps, num_stages=stages)
    return y if split == 1 else _finish(y, m, n, x.dtype)


def gemm_mxfp4(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``gemm.mxfp4``: x [T, K] @ dequant_mxfp4(packed [N, K/2], scale [N, K/32])^T -> [T, N] in x.dtype."""
    if not supports_mxfp4(x, packed, scale):
        return hand_off("gemm.mxfp4", f"operands x {x.dtype} packed {packed.dtype} scale {scale.dtype} on "
                        f"{x.device} not covered", mxfp4, x, packed, scale)
    x, p, s = _prep_mxfp4(x, packed, scale)
    m, n = x.shape[0], p.shape[0]
    if m == 0:
        return x.new_zeros(0, n)
    return _launch_mxfp4(x, p, s, _tiles(m, n, 2 * p.shape[1], x.dtype, x.device, 128))


# -- batch-invariant variants (provider ``triton_bi``) -----------------------------------
# One tile shape for every M. 64 x 64 is what the default launch uses for 17..64 rows, so decode
# up to batch 64 costs the same; fewer rows pad the tile (decode reads weights, the extra MMA rows
# are nearly free), prefill re-dequantises the weight once per 64 rows instead of switching to cuBLAS.
BI_BLOCK_M, BI_BLOCK_N = 64, 64
# Split-K sizing constant: a fixed number rather than the device's SM count, so the split (and with
# it the bits) is the same on every GPU model; a wrong value costs speed only.
_BI_SMS = 132


def bi_tiles(n: int, k: int, dtype: torch.dtype, k_align: int) -> tuple[int, int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, warps, stages) from (N, K, dtype) only, never from M.

    Split-K doubles while the column tiles alone do not cover the SMs and each split keeps >= 4 K tiles.
    """
    fp32 = dtype == torch.float32
    bk = min(32 if fp32 else 128, k_align)
    tiles = triton.cdiv(n, BI_BLOCK_N)
    k_blocks = triton.cdiv(k, bk)
    split = 1
    while tiles * split < _BI_SMS and k_blocks // (split * 2) >= 4 and split < 16:
        split *= 2
    return BI_BLOCK_M, BI_BLOCK_N, bk, split, 4, 3 if fp32 else 4


def gemm_fp8_block_bi(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, block) -> torch.Tensor:
    """``gemm.fp8_block``, batch-invariant: [T, K] x [N, K] e4m3 -> [T, N] in x.dtype, one tiling for all T."""
    if not supports_fp8(x, q, scale, block):
        return hand_off("gemm.fp8_block[bi]", f"operands x {x.dtype} q {q.dtype} scale {scale.dtype} on "
                        f"{x.device} block {block!r} not covered", fp8_block, x, q, scale, block)
    x, q, s, s_cols, bn_blk, bk_blk, e8 = _prep_fp8(x, q, scale, block)
    n, k = q.shape
    if x.shape[0] == 0:
        return x.new_zeros(0, n)
    return _launch_fp8(x, q, s, s_cols, bn_blk, bk_blk, e8, bi_tiles(n, k, x.dtype, bk_blk & -bk_blk))


def gemm_mxfp4_bi(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``gemm.mxfp4``, batch-invariant: [T, K] x MXFP4 [N, K/2] -> [T, N] in x.dtype, one tiling for all T."""
    if not supports_mxfp4(x, packed, scale):
        return hand_off("gemm.mxfp4[bi]", f"operands x {x.dtype} packed {packed.dtype} scale {scale.dtype} on "
                        f"{x.device} not covered", mxfp4, x, packed, scale)
    x, p, s = _prep_mxfp4(x, packed, scale)
    n, k = p.shape[0], 2 * p.shape[1]
    if x.shape[0] == 0:
        return x.new_zeros(0, n)
    return _launch_mxfp4(x, p, s, bi_tiles(n, k, x.dtype, 128))


@triton.jit
def _dense_gemm_kernel(x_ptr, w_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym, k_per_split,
                       SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       PREC: tl.constexpr):
    """y = x @ w^T with w cast to x's dtype in registers (the reference casts the whole weight first)."""
    rm, rn, mmask, nmask, k_lo, k_hi = _tile(M, N, K, k_per_split, BLOCK_M, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        kmask = rk < k_hi
        x = _x_tile(x_ptr, rm, rk, mmask, kmask, stride_xm)
        w = tl.load(w_ptr + rn[:, None].to(tl.int64) * stride_wn + rk[None, :], mask=nmask[:, None] & kmask[None, :],
                    other=0.0).to(x.dtype)
        acc += tl.dot(x, tl.trans(w), input_precision=PREC)
    _store_tile(y_ptr, acc, rm, rn, mmask, nmask, M, N, stride_ym, SPLIT_K)


def supports_dense_bi(x: torch.Tensor, w: torch.Tensor) -> bool:
    """CUDA x (fp32/bf16/fp16) and a float w (cast to x.dtype in the kernel)."""
    return on_cuda(x, w) and x.dtype in FLOATS and w.dtype in FLOATS


def gemm_dense_bi(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``gemm.dense``, batch-invariant: x [T, K] @ w [N, K]^T -> [T, N] in x.dtype (w cast to x.dtype).

    A Triton GEMM with ``bi_tiles`` instead of cuBLAS (which picks its kernel, and so its reduction
    order, from the shape) or the reference's 8-row cuBLAS tiles (one launch per 8 rows)."""
    if not supports_dense_bi(x, w):
        return hand_off("gemm.dense[bi]", f"operands {x.dtype}/{w.dtype} on {x.device} not covered", dense, x, w)
    if w.dim() != 2:
        raise ValueError(f"gemm.dense: w must be [N, K], got shape {tuple(w.shape)}")
    _check_x(x, w.shape[1], "gemm.dense")
    m, (n, k) = x.shape[0], w.shape
    if m == 0:
        return x.new_zeros(0, n)
    x = x if x.stride(1) == 1 else x.contiguous()
    w = w if w.stride(1) == 1 else w.contiguous()
    return _launch_dense(x, w, bi_tiles(n, k, x.dtype, 128))


def _launch_dense(x: torch.Tensor, w: torch.Tensor, tiles) -> torch.Tensor:
    """One launch of the dense kernel (+ the split-K sum): x [M, K] @ w [N, K]^T, both unit-stride in K."""
    m, (n, k) = x.shape[0], w.shape
    bm, bn, bk, split, warps, stages = tiles
    grid, k_per, split, y = _split_plan(x, n, k, bm, bn, bk, split)
    _dense_gemm_kernel[grid](x, w, y, m, n, k, x.stride(0), w.stride(0), n, k_per, SPLIT_K=split, BLOCK_M=bm,
                             BLOCK_N=bn, BLOCK_K=bk, PREC=dot_precision(x.dtype), num_warps=warps, num_stages=stages)
    return y if split == 1 else _finish(y, m, n, x.dtype)


def gemm_dense_wide_bi(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``gemm.dense_wide``, batch-invariant: ``gemm_dense_bi`` of x and w widened to ``wide_dtype(w)`` (the casts
    are elementwise, so each row's bits still do not depend on the batch; a half-precision w's fp32 copy is made once
    and kept, ``wide_copies``)."""
    if not supports_dense_bi(x, w):
        return hand_off("gemm.dense_wide[bi]", f"operands {x.dtype}/{w.dtype} on {x.device} not covered", dense_wide,
                        x, w)
    check_dense_wide(x, w)
    wide = wide_dtype(w)
    return gemm_dense_bi(x.to(wide), widened(w, wide))
