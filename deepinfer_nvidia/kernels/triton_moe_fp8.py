"""Routed experts on FP8 block-scaled weights (``moe.experts_fp8``) with no host synchronisation.

The FP8-expert checkpoints (V4-Flash-Base: e4m3 experts with [128, 128] fp32 block scales; UE8M0 scales are
taken too) used to run a per-expert loop that read the routed experts' ids on the host once a call, so a decode
step holding it could not be captured in a CUDA graph and decoded eagerly. This is the grouped form of
``triton_moe``'s MXFP4 kernels with an FP8 tile decode:

1. ``triton_moe.align``: the T*k (token, slot) pairs sorted by expert into ``BLOCK_M``-row blocks whose count
   is bounded on the host (fixed shapes, device ops only);
2. ``_fp8_up_kernel``: grid (blocks, F / BLOCK_N); the block's token rows times the expert's w1 and w3 tiles,
   each decoded in registers as ``(q * scale[n // bn, k // bk]).to(x.dtype)``, then the clamped SwiGLU;
3. ``_fp8_down_kernel``: ``h @ dequant(w2[e])^T`` rounded to x.dtype, times the routing weight, into the pair's
   own fp32 row of ``y [P, D]`` (no atomics);
4. ``triton_gemm.sum_slices``: each token's k rows summed in slot order (one launch).

Numerics are the reference's (``deepinfer_core.kernels.ops.moe.experts_fp8``): weights dequantised in fp32 and
rounded to x.dtype, products accumulated in fp32 and rounded to x.dtype, clamp and SiLU in fp32 rounded to
x.dtype, fp32 weighting and sum; only summation orders differ. A K tile never straddles a scale block
(``BLOCK_K`` divides ``bk``), so each tile reads one scale per weight row.

With fixed tiles (``BI_TILES``) a pair's row sees the same K tiles and dot shapes in any batch: sorting moves
rows, never changes them, and the k slots are summed in slot order, which is what the batch-invariant provider
needs. Not measured on the H200 yet (written when the session had no device time): the tiles are
``triton_moe.TUNE``'s, the MXFP4 kernels' measured choice.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_core.kernels.ops.quant import QuantFormatError, fp8_block_scale_shape
from deepinfer_nvidia.kernels._common import dot_precision, next_pow2
from deepinfer_nvidia.kernels.triton_gemm import _ue8m0, sum_slices
from deepinfer_nvidia.kernels.triton_moe_common import _expert_block, _swiglu

# (block_n, num_warps, num_stages, widest K tile) per BLOCK_M. H200, V4-Flash widths (256 experts, D 4096,
# F 2048, fp32 [128, 128] scales), one CUDA graph per call (bench_moe_fp8, pass18a, docs/performance.md
# eighteenth pass): K tiles of 128 columns instead of 64 at BLOCK_M 16 took 1 token 103.9 -> 85.0 us,
# 8 tokens 557 -> 387 us, 64 tokens 2191 -> 1557 us (bit-identical outputs); 4 warps at BLOCK_M 64 took
# 4096 tokens 6873 -> 6270 us and 8192 tokens 12054 -> 11155 us; BLOCK_M 32 moved 3%.
TUNE: dict[int, tuple[int, int, int, int]] = {16: (64, 4, 4, 128), 32: (64, 4, 3, 128), 64: (128, 4, 3, 64)}
# (block_m, block_n, warps, stages, widest K tile) of the batch-invariant provider: every batch, the same tiles
# (the decode entry of TUNE)
BI_TILES = (16, 64, 4, 4, 128)


# Widest K tile when no TUNE entry says otherwise: 64 e4m3 columns, the weight bytes a K tile of the MXFP4
# kernels reads (128 columns packed in 64 bytes).
MAX_BLOCK_K = 64


def block_k_for(k: int, bk: int, max_k: int | None = None) -> int:
    """The K tile: a power of two that divides the scale block ``bk`` (one scale column a tile), at most
    ``max_k`` (default ``MAX_BLOCK_K``) and not much wider than K; 0 when no tile of at least 16 (tl.dot's
    minimum) divides ``bk``."""
    low = bk & -bk
    tile = min(max_k or MAX_BLOCK_K, low, max(16, next_pow2(k)))
    return tile if tile >= 16 else 0


def takes(x: torch.Tensor, w1: torch.Tensor, block) -> bool:
    """Whether the grouped kernels cover these operands (else the caller keeps the per-expert loop)."""
    return (w1.dtype == torch.float8_e4m3fn and w1.dim() == 3 and x.dim() == 2 and
            block_k_for(x.shape[1], int(block[1])) > 0 and block_k_for(w1.shape[1], int(block[1])) > 0)


@triton.jit
def _fp8_tile(q_ptr, s_ptr, rn, nmask, k0, K, s_cols, bn_blk, bk_blk, dtype: tl.constexpr,
              SCALE_E8M0: tl.constexpr, BLOCK_K: tl.constexpr):
    """Weight rows ``rn`` of an e4m3 matrix [N, K] (scales [ceil(N/bn), s_cols]), columns k0..k0+BLOCK_K,
    dequantised and rounded to ``dtype``: [BLOCK_N, BLOCK_K]. The tile lies inside one scale column."""
    rk = k0 + tl.arange(0, BLOCK_K)
    w8 = tl.load(q_ptr + rn[:, None].to(tl.int64) * K + rk[None, :], mask=nmask[:, None] & (rk[None, :] < K),
                 other=0.0)
    srow = (rn // bn_blk) * s_cols + k0 // bk_blk
    if SCALE_E8M0:
        sc = _ue8m0(tl.load(s_ptr + srow, mask=nmask, other=127).to(tl.int32))
    else:
        sc = tl.load(s_ptr + srow, mask=nmask, other=1.0)
    return (w8.to(tl.float32) * sc[:, None]).to(dtype)


@triton.jit
def _fp8_up_kernel(x_ptr, pair_ptr, bexp_ptr, w1_ptr, s1_ptr, w3_ptr, s3_ptr, h_ptr, P, E, D, F, stride_x, limit,
                   s_rows, s_cols, bn_blk, bk_blk, TOPK: tl.constexpr, SCALE_E8M0: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PREC: tl.constexpr):
    pid_b = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(bexp_ptr + pid_b)
    if e >= E:
        return
    rows, pair, valid, rn, nmask = _expert_block(pair_ptr, pid_b, pid_n, P, F, BLOCK_M, BLOCK_N)
    tok = (pair // TOPK).to(tl.int64)
    dtype = x_ptr.dtype.element_ty
    e64 = e.to(tl.int64)
    w1 = w1_ptr + e64 * F * D
    w3 = w3_ptr + e64 * F * D
    s1 = s1_ptr + e64 * s_rows * s_cols
    s3 = s3_ptr + e64 * s_rows * s_cols
    acc1 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, D, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        xt = tl.load(x_ptr + tok[:, None] * stride_x + rk[None, :], mask=valid[:, None] & (rk[None, :] < D),
                     other=0.0)
        w = _fp8_tile(w1, s1, rn, nmask, k0, D, s_cols, bn_blk, bk_blk, dtype, SCALE_E8M0, BLOCK_K)
        acc1 += tl.dot(xt, tl.trans(w), input_precision=PREC)
        w = _fp8_tile(w3, s3, rn, nmask, k0, D, s_cols, bn_blk, bk_blk, dtype, SCALE_E8M0, BLOCK_K)
        acc3 += tl.dot(xt, tl.trans(w), input_precision=PREC)
    h = _swiglu(acc1, acc3, limit, dtype)  # the reference's clamped SwiGLU and roundings (shared with split-K)
    tl.store(h_ptr + rows[:, None].to(tl.int64) * F + rn[None, :], h, mask=nmask[None, :])


@triton.jit
def _fp8_down_kernel(h_ptr, pair_ptr, bexp_ptr, wt_ptr, w2_ptr, s2_ptr, y_ptr, P, E, D, F, s_rows, s_cols, bn_blk,
                     bk_blk, SCALE_E8M0: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, PREC: tl.constexpr):
    pid_b = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(bexp_ptr + pid_b)
    if e >= E:
        return
    rows, pair, valid, rn, nmask = _expert_block(pair_ptr, pid_b, pid_n, P, D, BLOCK_M, BLOCK_N)
    dtype = h_ptr.dtype.element_ty
    e64 = e.to(tl.int64)
    w2 = w2_ptr + e64 * D * F
    s2 = s2_ptr + e64 * s_rows * s_cols
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, F, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        ht = tl.load(h_ptr + rows[:, None].to(tl.int64) * F + rk[None, :], mask=rk[None, :] < F, other=0.0)
        w = _fp8_tile(w2, s2, rn, nmask, k0, F, s_cols, bn_blk, bk_blk, dtype, SCALE_E8M0, BLOCK_K)
        acc += tl.dot(ht, tl.trans(w), input_precision=PREC)
    wt = tl.load(wt_ptr + pair, mask=valid, other=0.0)
    y = acc.to(dtype).to(tl.float32) * wt[:, None]
    tl.store(y_ptr + pair[:, None].to(tl.int64) * D + rn[None, :], y, mask=valid[:, None] & nmask[None, :])


def _scales(name: str, s: torch.Tensor, e: int, n: int, k: int, block) -> tuple[torch.Tensor, bool]:
    """Check ``s [E, ceil(n/bn), ceil(k/bk)]`` and lay it out for the kernels: (tensor, UE8M0?)."""
    want = (e,) + fp8_block_scale_shape(n, k, block)
    if tuple(s.shape) != want:
        raise QuantFormatError(f"moe.experts_fp8: {name} must have shape {list(want)} for block {tuple(block)}, "
                               f"got {list(s.shape)}")
    if s.dtype in (torch.float8_e8m0fnu, torch.uint8):
        return s.view(torch.uint8).contiguous(), True
    if s.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise QuantFormatError(f"moe.experts_fp8: {name} has unsupported dtype {s.dtype}")
    return s.float().contiguous(), False


def _check_weight(name: str, w: torch.Tensor, e: int, n: int, k: int) -> None:
    if tuple(w.shape) != (e, n, k) or w.dtype != torch.float8_e4m3fn:
        raise QuantFormatError(f"moe.experts_fp8: {name} must be float8_e4m3fn [{e}, {n}, {k}], got {w.dtype} "
                               f"{list(w.shape)}")


def grouped_fp8(x, weights, ids, w1, s1, w3, s3, w2, s2, block, limit, block_m: int | None = None,
                block_n: int | None = None, warps: int | None = None, stages: int | None = None,
                max_k: int | None = None) -> torch.Tensor:
    """x [T, D] (bf16/fp16/fp32); weights [T, k]; ids [T, k]; w1, w3 [E, F, D] e4m3 + scales
    [E, ceil(F/bn), ceil(D/bk)]; w2 [E, D, F] + [E, ceil(D/bn), ceil(F/bk)]; block (bn, bk).
    Returns [T, D] in x.dtype. No host synchronisation (capturable). ``block_m`` ... ``max_k`` (the widest K
    tile): tile knobs (defaults: ``triton_moe.block_m_for`` and ``TUNE``)."""
    from deepinfer_nvidia.kernels.triton_moe import align, block_m_for

    t, d = x.shape
    k = ids.shape[1]
    ne, f = w1.shape[0], w1.shape[1]
    bn_blk, bk_blk = int(block[0]), int(block[1])
    _check_weight("w1", w1, ne, f, d)
    _check_weight("w3", w3, ne, f, d)
    _check_weight("w2", w2, ne, d, f)
    (s1, e8), (s3, _), (s2, _) = (_scales("s1", s1, ne, f, d, block), _scales("s3", s3, ne, f, d, block),
                                  _scales("s2", s2, ne, d, f, block))
    if t == 0 or k == 0:
        return torch.zeros(t, d, dtype=x.dtype, device=x.device)
    x = x if x.stride(1) == 1 else x.contiguous()
    p = t * k
    bm = block_m or block_m_for(p, ne)
    tn, tw, ts, tk = TUNE.get(bm, (64, 4, 3, MAX_BLOCK_K))
    block_n, warps, stages, max_k = block_n or tn, warps or tw, stages or ts, max_k or tk
    pair, bexp = align(ids, ne, bm)
    nb = bexp.numel()
    prec = dot_precision(x.dtype)
    q1, q3, q2 = (a.contiguous() for a in (w1, w3, w2))
    h = torch.empty(nb * bm, f, dtype=x.dtype, device=x.device)
    sr1, sc1 = s1.shape[1], s1.shape[2]
    _fp8_up_kernel[(nb, triton.cdiv(f, block_n))](x, pair, bexp, q1, s1, q3, s3, h, p, ne, d, f, x.stride(0),
                                                  float(limit), sr1, sc1, bn_blk, bk_blk, TOPK=k, SCALE_E8M0=e8,
                                                  BLOCK_M=bm, BLOCK_N=block_n, BLOCK_K=block_k_for(d, bk_blk, max_k),
                                                  PREC=prec, num_warps=warps, num_stages=stages)
    y = torch.empty(p, d, dtype=torch.float32, device=x.device)
    wt = weights.reshape(-1).float().contiguous()
    _fp8_down_kernel[(nb, triton.cdiv(d, block_n))](h, pair, bexp, wt, q2, s2, y, p, ne, d, f, s2.shape[1],
                                                    s2.shape[2], bn_blk, bk_blk, SCALE_E8M0=e8, BLOCK_M=bm,
                                                    BLOCK_N=block_n, BLOCK_K=block_k_for(f, bk_blk, max_k), PREC=prec,
                                                    num_warps=warps, num_stages=stages)
    return sum_slices(y, t, d, k, d, k * d, x.dtype)  # the k slots of each token, in slot order


__all__ = ["BI_TILES", "TUNE", "block_k_for", "grouped_fp8", "takes"]
