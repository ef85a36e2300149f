"""Split-K MXFP4 experts with the weight decode shared by up to R routed pairs of one expert.

``triton_moe_splitk`` decodes every weight element once per routed *pair*. On the H200 that costs ~10 us per
pair at V4.1 widths (35.4 M elements; ninth pass), and at batch 64 the 384 pairs fall on ~237 distinct
experts (768 on ~332 at batch 128), so most of the decode work is repeated. Here the pairs, sorted by expert,
are cut into *segments*: runs of one expert, chunked into at most R consecutive pairs. One program per
(segment, row tile, K split) decodes its weight tile once and multiplies it with the R activation rows
(absent rows masked to zero), so the decode is paid once per segment and the FMAs once per pair.

- ``_segments_kernel`` (one program): ``starts[s]`` = first sorted position of segment s, ``nseg[0]`` the
  count. No host synchronisation: the GEMV grids keep P programs on their first axis and programs
  ``>= nseg`` return at once.
- ``_up_seg_kernel`` / ``_down_seg_kernel``: the word decode of ``triton_moe_splitk`` (nibble pairs into
  fp16 halves, exact), activations as 8 planes ``[R, GROUPS, 4]``, products ``[R, BLOCK_N, GROUPS, 4]``;
  partials and ``h`` rows are written per pair exactly as the per-pair kernels do, so ``_act_kernel`` and
  ``_finish_kernel`` are shared, and the result equals the per-pair path's up to fp32 summation order (the
  same K grouping and split order; only the products' grouping into a 4-D tile differs).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_nvidia.kernels.triton_gemm import _ue8m0
from deepinfer_nvidia.kernels.triton_moe_common import _swiglu
from deepinfer_nvidia.kernels.triton_moe_splitk import _act_kernel, _finish_kernel, _nibble_pair, split_for

# Pairs per program (R) and the smallest pair count from which ``moe.experts_mxfp4`` (provider triton) takes
# this path instead of the per-pair one (up to ``triton_moe_splitk.SPLITK_PAIRS``); R = 1 disables it.
# H200 (docs/performance.md, ninth pass): this version lost to the per-pair kernels at every batch (R=2 at
# batch 64: 5986 vs 4140 us per V4.1 layer), so it is off by default; bench_moe times it and may enable it.
SEG_R = 1
SEG_MIN_PAIRS = 96


@triton.jit
def _max_combine(a, b):
    return tl.maximum(a, b)


@triton.jit
def _segments_kernel(se_ptr, starts_ptr, nseg_ptr, P, R: tl.constexpr, PB: tl.constexpr):
    """Sorted experts ``se [P]`` -> segment starts (runs of one expert cut every R pairs) and their count."""
    i = tl.arange(0, PB)
    m = i < P
    s = tl.load(se_ptr + i, mask=m, other=-1)
    prev = tl.load(se_ptr + i - 1, mask=m & (i > 0), other=-1)
    new_run = m & ((i == 0) | (s != prev))
    run_start = tl.associative_scan(tl.where(new_run, i, 0), 0, _max_combine)
    flag = m & ((i - run_start) % R == 0)
    sid = tl.cumsum(flag.to(tl.int32), 0) - 1
    tl.store(starts_ptr + sid, i, mask=flag)
    tl.store(nseg_ptr + i * 0, tl.sum(flag.to(tl.int32), 0), mask=i == 0)


@triton.jit
def _seg_rows(order_ptr, se_ptr, starts_ptr, pid_s, P, R: tl.constexpr):
    """Segment ``pid_s`` (it starts at sorted position ``starts[pid_s]``): its pair ids [R] (int64), their validity
    [R] (inside P and on the segment's expert: a segment never crosses a run) and the expert (int64)."""
    start = tl.load(starts_ptr + pid_s)
    e = tl.load(se_ptr + start)
    rr = start + tl.arange(0, R)
    inside = rr < P
    same = tl.load(se_ptr + rr, mask=inside, other=-1) == e
    valid = inside & same
    pair = tl.load(order_ptr + rr, mask=valid, other=0).to(tl.int64)
    return pair, valid, e.to(tl.int64)


@triton.jit
def _planes_r(base_ptr, rows, valid, row_len, plane, rg, gmask):
    """8 activation planes [R, GROUPS, 4] (fp32) of rows ``rows`` [R] (plane j: elements 8i+j)."""
    xi = rg[:, None] * 4 + tl.arange(0, 4)[None, :]
    ptr = base_ptr + rows[:, None, None] * row_len + xi[None, :, :]
    xm = valid[:, None, None] & gmask[None, :, None]
    return (tl.load(ptr, mask=xm, other=0.0).to(tl.float32),
            tl.load(ptr + plane, mask=xm, other=0.0).to(tl.float32),
            tl.load(ptr + 2 * plane, mask=xm, other=0.0).to(tl.float32),
            tl.load(ptr + 3 * plane, mask=xm, other=0.0).to(tl.float32),
            tl.load(ptr + 4 * plane, mask=xm, other=0.0).to(tl.float32),
            tl.load(ptr + 5 * plane, mask=xm, other=0.0).to(tl.float32),
            tl.load(ptr + 6 * plane, mask=xm, other=0.0).to(tl.float32),
            tl.load(ptr + 7 * plane, mask=xm, other=0.0).to(tl.float32))


@triton.jit
def _gemv_tile_r(w_ptr, s_ptr, rn, nmask, rg, gmask, KG, x0, x1, x2, x3, x4, x5, x6, x7,
                 GROUPS: tl.constexpr, ASM: tl.constexpr):
    """One decoded weight tile [BLOCK_N, GROUPS groups] against R activation rows: [R, BLOCK_N, GROUPS] fp32."""
    rw = tl.arange(0, 4)
    m2 = nmask[:, None] & gmask[None, :]
    off = rn[:, None].to(tl.int64) * KG + rg[None, :]
    w = tl.load(w_ptr + off[:, :, None] * 4 + rw[None, None, :], mask=m2[:, :, None], other=0)
    lo, hi = _nibble_pair(w, 0, ASM)
    part = lo[None] * x0[:, None] + hi[None] * x4[:, None]
    lo, hi = _nibble_pair(w, 1, ASM)
    part += lo[None] * x1[:, None] + hi[None] * x5[:, None]
    lo, hi = _nibble_pair(w, 2, ASM)
    part += lo[None] * x2[:, None] + hi[None] * x6[:, None]
    lo, hi = _nibble_pair(w, 3, ASM)
    part += lo[None] * x3[:, None] + hi[None] * x7[:, None]
    sb = tl.load(s_ptr + off, mask=m2, other=127).to(tl.int32)
    return (tl.sum(part, axis=3) * 16384.0) * _ue8m0(sb)[None]


@triton.jit
def _up_seg_kernel(x8_ptr, order_ptr, se_ptr, starts_ptr, nseg_ptr, w1_ptr, s1_ptr, w3_ptr, s3_ptr, part_ptr,
                   h_ptr, P, D, F, limit, g_per, TOPK: tl.constexpr, DIRECT: tl.constexpr, R: tl.constexpr,
                   BLOCK_N: tl.constexpr, GROUPS: tl.constexpr, ASM: tl.constexpr):
    pid_s = tl.program_id(0)
    if pid_s >= tl.load(nseg_ptr):
        return
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    pair, valid, e = _seg_rows(order_ptr, se_ptr, starts_ptr, pid_s, P, R)
    KG = D // 32
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rn < F
    w1 = w1_ptr + e * F * (D // 8)
    w3 = w3_ptr + e * F * (D // 8)
    s1 = s1_ptr + e * F * KG
    s3 = s3_ptr + e * F * KG
    acc1 = tl.zeros([R, BLOCK_N, GROUPS], dtype=tl.float32)
    acc3 = tl.zeros([R, BLOCK_N, GROUPS], dtype=tl.float32)
    g_lo = pid_k * g_per
    g_hi = tl.minimum(g_lo + g_per, KG)
    for g0 in range(g_lo, g_hi, GROUPS):
        rg = g0 + tl.arange(0, GROUPS)
        gmask = rg < g_hi
        x0, x1, x2, x3, x4, x5, x6, x7 = _planes_r(x8_ptr, pair // TOPK, valid, D, D // 8, rg, gmask)
        acc1 += _gemv_tile_r(w1, s1, rn, nmask, rg, gmask, KG, x0, x1, x2, x3, x4, x5, x6, x7, GROUPS, ASM)
        acc3 += _gemv_tile_r(w3, s3, rn, nmask, rg, gmask, KG, x0, x1, x2, x3, x4, x5, x6, x7, GROUPS, ASM)
    a1 = tl.sum(acc1, axis=2)  # [R, BLOCK_N]
    a3 = tl.sum(acc3, axis=2)
    om = valid[:, None] & nmask[None, :]
    if DIRECT:
        h = _swiglu(a1, a3, limit, h_ptr.dtype.element_ty)
        tl.store(h_ptr + pair[:, None] * F + ((rn % 8) * (F // 8) + rn // 8)[None, :], h, mask=om)
    else:
        base = part_ptr + (pid_k * 2 * P + pair[:, None]) * F + rn[None, :]
        tl.store(base, a1, mask=om)
        tl.store(base + P * F, a3, mask=om)


@triton.jit
def _down_seg_kernel(h_ptr, order_ptr, se_ptr, starts_ptr, nseg_ptr, w2_ptr, s2_ptr, part_ptr, P, D, F, g_per,
                     R: tl.constexpr, BLOCK_N: tl.constexpr, GROUPS: tl.constexpr, ASM: tl.constexpr):
    pid_s = tl.program_id(0)
    if pid_s >= tl.load(nseg_ptr):
        return
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    pair, valid, e = _seg_rows(order_ptr, se_ptr, starts_ptr, pid_s, P, R)
    KG = F // 32
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rn < D
    w2 = w2_ptr + e * D * (F // 8)
    s2 = s2_ptr + e * D * KG
    acc = tl.zeros([R, BLOCK_N, GROUPS], dtype=tl.float32)
    g_lo = pid_k * g_per
    g_hi = tl.minimum(g_lo + g_per, KG)
    for g0 in range(g_lo, g_hi, GROUPS):
        rg = g0 + tl.arange(0, GROUPS)
        gmask = rg < g_hi
        h0, h1, h2, h3, h4, h5, h6, h7 = _planes_r(h_ptr, pair, valid, F, F // 8, rg, gmask)
        acc += _gemv_tile_r(w2, s2, rn, nmask, rg, gmask, KG, h0, h1, h2, h3, h4, h5, h6, h7, GROUPS, ASM)
    tl.store(part_ptr + (pid_k * P + pair[:, None]) * D + rn[None, :], tl.sum(acc, axis=2),
             mask=valid[:, None] & nmask[None, :])


def segments_mxfp4(x, weights, ids, w1, s1, w3, s3, w2, s2, limit, pairs_per_program: int = 2,
                   block_n: int = 16, groups: int = 8, warps: int = 4, stages: int = 3, programs: int = 2048,
                   asm: int = 1) -> torch.Tensor:
    """``moe.experts_mxfp4`` for decode batches, the decode of each weight tile shared by up to
    ``pairs_per_program`` (R, a power of two) pairs of one expert. Operands as ``triton_moe_splitk.splitk_mxfp4``
    (validated by ``triton_moe``); no host synchronisation."""
    t, d = x.shape
    k = ids.shape[1]
    f = w1.shape[1]
    p = t * k
    r = int(pairs_per_program)
    if r < 1 or r & (r - 1):
        raise ValueError(f"pairs_per_program must be a power of two, got {pairs_per_program}")
    dev = x.device
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    se = flat.index_select(0, order).contiguous()
    starts = torch.empty(p, dtype=torch.int32, device=dev)
    nseg = torch.empty(1, dtype=torch.int32, device=dev)
    _segments_kernel[(1,)](se, starts, nseg, p, R=r, PB=max(16, triton.next_power_of_2(p)), num_warps=4)
    x8 = x.reshape(t, d // 8, 8).transpose(1, 2).contiguous()  # [T, 8, D/8]
    u8 = [a.view(torch.uint8) for a in (w1, s1, w3, s3, w2, s2)]
    for i in (0, 2, 4):
        u8[i] = u8[i].view(torch.int32)
    h = torch.empty(p, f, dtype=x.dtype, device=dev)
    # split sized for the expected segment count (~distinct experts), not for P
    sp1, gp1 = split_for(max(1, p // r), f, d // 32, block_n, groups, programs)
    part1 = torch.empty(2 * sp1 * p * f if sp1 > 1 else 1, dtype=torch.float32, device=dev)
    _up_seg_kernel[(p, triton.cdiv(f, block_n), sp1)](x8, order, se, starts, nseg, u8[0], u8[1], u8[2], u8[3],
                                                      part1, h, p, d, f, float(limit), gp1, TOPK=k,
                                                      DIRECT=sp1 == 1, R=r, BLOCK_N=block_n, GROUPS=groups,
                                                      ASM=bool(asm), num_warps=warps, num_stages=stages)
    if sp1 > 1:
        blk = min(1024, max(128, triton.next_power_of_2(f)))
        _act_kernel[(p, triton.cdiv(f, blk))](part1, h, p, f, sp1, float(limit), BLOCK=blk, num_warps=4)
    sp2, gp2 = split_for(max(1, p // r), d, f // 32, block_n, groups, programs)
    part2 = torch.empty(sp2 * p * d, dtype=torch.float32, device=dev)
    _down_seg_kernel[(p, triton.cdiv(d, block_n), sp2)](h, order, se, starts, nseg, u8[4], u8[5], part2, p, d, f,
                                                        gp2, R=r, BLOCK_N=block_n, GROUPS=groups, ASM=bool(asm),
                                                        num_warps=warps, num_stages=stages)
    out = torch.empty(t, d, dtype=x.dtype, device=dev)
    wt = weights.reshape(-1).float().contiguous()
    blk = min(1024, max(128, triton.next_power_of_2(d)))
    _finish_kernel[(t, triton.cdiv(d, blk))](part2, wt, out, p, d, sp2, TOPK=k, BLOCK=blk, num_warps=4)
    return out
