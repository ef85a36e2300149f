"""Routed MXFP4 experts through Triton's ``tl.dot_scaled`` (block-scaled dot: e2m1 weights, UE8M0 scales).

The grouped kernels of ``triton_moe`` decode every weight nibble by hand (fp16 bit pattern, fp32 multiply by
the group scale, cast), ~7 integer and float ops per element, and split the activations into even and odd
column planes. Here the weight tile goes to the compiler as what it is: packed e2m1 bytes ``[BLOCK_K/2,
BLOCK_N]`` with their UE8M0 scales ``[BLOCK_N, BLOCK_K/32]``. On SM100 Triton lowers ``tl.dot_scaled`` to the
native block-scaled MMA; on SM90 it upcasts the tile to bf16 with its own conversion sequence (exact: an
E2M1 value times a power of two is a bf16 number unless it under- or overflows) and feeds the bf16 tensor
cores. The activations stay contiguous ``[BLOCK_M, BLOCK_K]`` bf16 tiles.

Layout and flow are those of ``triton_moe.grouped_mxfp4``: ``triton_moe.align`` sorts the T*k pairs into
``BLOCK_M``-row blocks owned by one expert (no host synchronisation); the up kernel writes the clamped
SwiGLU ``h [blocks*BLOCK_M, F]``; the down kernel writes each pair's weighted row of ``y [P, D]`` (fp32);
``sum_slices`` adds the k slots of a token in slot order. The grid is 1-D and block-major (program
``p`` -> block ``p // NT``, N tile ``p % NT``), so the programs that run together share a block's activation
rows through L2 while each streams its own weight tile.

Numerics: the reference's roundings (gate/up products rounded to x.dtype, clamp, SiLU in fp32 rounded to
x.dtype, product rounded, down product rounded, fp32 weighting and slot-order sum); only the order of the
fp32 K accumulation differs. bf16 activations only (what the engine runs); other dtypes take the grouped path.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_nvidia.kernels._common import next_pow2
from deepinfer_nvidia.kernels.triton_gemm import sum_slices

# (block_m, block_n, block_k, warps, stages) by BLOCK_M. H200, V4.1 widths (docs/performance.md, tenth pass):
# 16 rows: 16x64x128, 4 warps, 4 stages won at 6-1536 pairs; 32 rows: 32x64x256 at 6144 pairs; 128 rows:
# 128x64x128, 4 warps at 49152 and 98304 pairs (128x128x128 / 8 warps within 2%); 64 rows: not the best
# anywhere measured, kept between the two.
SCALED_TUNE: dict[int, tuple[int, int, int, int, int]] = {
    16: (16, 64, 128, 4, 4), 32: (32, 64, 256, 4, 3), 64: (64, 128, 128, 8, 3), 128: (128, 64, 128, 4, 3)}
# Pairs (tokens x top-k) from which ``moe.experts_mxfp4`` takes this path (0: never). H200, V4.1 widths: it
# beat the hand-decoded grouped kernels at every measured size (384 pairs 4453 vs 5570 us, 1536: 6784 vs 8612,
# 6144: 8031 vs 13220) and dequant-once at 49152 (18055 vs 27649 us) and 98304 (29629 vs 34408); below
# SPLITK_PAIRS split-K wins (at 768 pairs this path won: 6234 vs split-K 7536).
SCALED_PAIRS = 1


def block_m_for(pairs: int, experts: int) -> int:
    """Rows per block from the mean number of pairs per routed expert: 16 / 32 / 64 / 128 (H200: 16 won at a
    mean of 4, 32 at 16, 128 at 128)."""
    mean = pairs / max(1, min(experts, pairs))
    return 16 if mean <= 8 else 32 if mean <= 24 else 64 if mean <= 64 else 128


@triton.jit
def _block_tile(pair_ptr, bexp_ptr, P, N, K, NT, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Program -> (expert, its block's rows, their pairs, valid rows, output columns ``rn`` of ``N``, their mask,
    and the packed-weight / scale row offsets of those columns in a stack ``[E, N, K/2]`` / ``[E, N, K/32]``).
    The grid is block-major: program p is block p // NT, column tile p % NT."""
    pid = tl.program_id(0)
    blk = pid // NT
    e = tl.load(bexp_ptr + blk)
    rows = blk * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(pair_ptr + rows)
    rn = (pid % NT) * BLOCK_N + tl.arange(0, BLOCK_N)
    e64 = e.to(tl.int64)
    wrow = e64 * N * (K // 2) + rn[:, None].to(tl.int64) * (K // 2)
    srow = e64 * N * (K // 32) + rn[:, None].to(tl.int64) * (K // 32)
    return e, rows, pair, pair < P, rn, rn < N, wrow, srow


@triton.jit
def _scaled_up_kernel(x_ptr, pair_ptr, bexp_ptr, w1_ptr, s1_ptr, w3_ptr, s3_ptr, h_ptr, P, E, D, F, stride_x,
                      limit, NT, TOPK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr):
    e, rows, pair, valid, rn, nmask, wrow, srow = _block_tile(pair_ptr, bexp_ptr, P, F, D, NT, BLOCK_M, BLOCK_N)
    if e >= E:
        return
    tok = (pair // TOPK).to(tl.int64)
    dtype = x_ptr.dtype.element_ty
    HALF: tl.constexpr = BLOCK_K // 2
    GROUPS: tl.constexpr = BLOCK_K // 32
    acc1 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, D, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        xt = tl.load(x_ptr + tok[:, None] * stride_x + rk[None, :], mask=valid[:, None] & (rk[None, :] < D),
                     other=0.0)
        rj = k0 // 2 + tl.arange(0, HALF)
        wm = nmask[:, None] & (rj[None, :] < D // 2)
        rg = k0 // 32 + tl.arange(0, GROUPS)
        sm = nmask[:, None] & (rg[None, :] < D // 32)
        b1 = tl.load(w1_ptr + wrow + rj[None, :], mask=wm, other=0)
        c1 = tl.load(s1_ptr + srow + rg[None, :], mask=sm, other=127)
        acc1 = tl.dot_scaled(xt, None, "bf16", tl.trans(b1), c1, "e2m1", acc1)
        b3 = tl.load(w3_ptr + wrow + rj[None, :], mask=wm, other=0)
        c3 = tl.load(s3_ptr + srow + rg[None, :], mask=sm, other=127)
        acc3 = tl.dot_scaled(xt, None, "bf16", tl.trans(b3), c3, "e2m1", acc3)
    g = tl.minimum(acc1.to(dtype).to(tl.float32), limit).to(dtype).to(tl.float32)
    s = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)
    u = tl.minimum(tl.maximum(acc3.to(dtype).to(tl.float32), -limit), limit).to(dtype).to(tl.float32)
    tl.store(h_ptr + rows[:, None].to(tl.int64) * F + rn[None, :], (s * u).to(dtype), mask=nmask[None, :])


@triton.jit
def _scaled_down_kernel(h_ptr, pair_ptr, bexp_ptr, wt_ptr, w2_ptr, s2_ptr, y_ptr, P, E, D, F, NT,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    e, rows, pair, valid, rn, nmask, wrow, srow = _block_tile(pair_ptr, bexp_ptr, P, D, F, NT, BLOCK_M, BLOCK_N)
    if e >= E:
        return
    dtype = h_ptr.dtype.element_ty
    HALF: tl.constexpr = BLOCK_K // 2
    GROUPS: tl.constexpr = BLOCK_K // 32
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, F, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        ht = tl.load(h_ptr + rows[:, None].to(tl.int64) * F + rk[None, :], mask=rk[None, :] < F, other=0.0)
        rj = k0 // 2 + tl.arange(0, HALF)
        rg = k0 // 32 + tl.arange(0, GROUPS)
        b2 = tl.load(w2_ptr + wrow + rj[None, :], mask=nmask[:, None] & (rj[None, :] < F // 2), other=0)
        c2 = tl.load(s2_ptr + srow + rg[None, :], mask=nmask[:, None] & (rg[None, :] < F // 32), other=127)
        acc = tl.dot_scaled(ht, None, "bf16", tl.trans(b2), c2, "e2m1", acc)
    wt = tl.load(wt_ptr + pair, mask=valid, other=0.0)
    y = acc.to(dtype).to(tl.float32) * wt[:, None]
    tl.store(y_ptr + pair[:, None].to(tl.int64) * D + rn[None, :], y, mask=valid[:, None] & nmask[None, :])


def supports_scaled(x: torch.Tensor) -> bool:
    """bf16 activations with rows of unit stride (the dot's lhs format)."""
    return x.dtype == torch.bfloat16 and x.dim() == 2


def expert_shapes(x: torch.Tensor, ids: torch.Tensor, w1: torch.Tensor) -> tuple:
    """The block-layout expert wrappers' common start: (x with unit-stride rows, T, D, k, experts, F)."""
    return (x if x.stride(1) == 1 else x.contiguous(), x.shape[0], x.shape[1], ids.shape[1], w1.shape[0],
            w1.shape[1])


def scaled_mxfp4(x, weights, ids, w1, s1, w3, s3, w2, s2, limit, block_m: int | None = None,
                 block_n: int | None = None, block_k: int | None = None, warps: int | None = None,
                 stages: int | None = None) -> torch.Tensor:
    """x [T, D] bf16; weights [T, k] float; ids [T, k] int; w1, w3 [E, F, D/2] uint8 + UE8M0 [E, F, D/32];
    w2 [E, D, F/2] + [E, D, F/32] -> [T, D] bf16. No host synchronisation (CUDA-graph safe). The stacks
    must already be checked (``triton_moe._check_stacks``); the tile knobs default to ``SCALED_TUNE``."""
    from deepinfer_nvidia.kernels.triton_moe import align  # lazy: triton_moe imports this module

    x, t, d, k, ne, f = expert_shapes(x, ids, w1)
    if t == 0 or k == 0:
        return torch.zeros(t, d, dtype=x.dtype, device=x.device)
    p = t * k
    bm = block_m or block_m_for(p, ne)
    tbm, tbn, tbk, tw, ts = SCALED_TUNE.get(bm, SCALED_TUNE[16])
    bn, bk, warps, stages = block_n or tbn, block_k or tbk, warps or tw, stages or ts
    pair, bexp = align(ids, ne, bm)
    nb = bexp.numel()
    u8 = [a.view(torch.uint8).contiguous() for a in (w1, s1, w3, s3, w2, s2)]
    h = torch.empty(nb * bm, f, dtype=x.dtype, device=x.device)
    nt1 = triton.cdiv(f, bn)
    _scaled_up_kernel[(nb * nt1,)](x, pair, bexp, u8[0], u8[1], u8[2], u8[3], h, p, ne, d, f, x.stride(0),
                                   float(limit), nt1, TOPK=k, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=min(bk, next_pow2(d)),
                                   num_warps=warps, num_stages=stages)
    y = torch.empty(p, d, dtype=torch.float32, device=x.device)
    nt2 = triton.cdiv(d, bn)
    wt = weights.reshape(-1).float().contiguous()
    _scaled_down_kernel[(nb * nt2,)](h, pair, bexp, wt, u8[4], u8[5], y, p, ne, d, f, nt2, BLOCK_M=bm,
                                     BLOCK_N=bn, BLOCK_K=min(bk, next_pow2(f)), num_warps=warps, num_stages=stages)
    return sum_slices(y, t, d, k, d, k * d, x.dtype)
