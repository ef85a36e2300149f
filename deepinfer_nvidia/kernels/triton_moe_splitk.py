"""Decode path of ``moe.experts_mxfp4``: split-K GEMV kernels, one program per (routed pair, row tile, K split).

At small pair counts (decode: ``T*k`` up to ``SPLITK_PAIRS``) the grouped kernels of ``triton_moe`` run one
16-row block per routed expert with mostly one valid row, and each program streams a whole K panel: few warps
in flight, latency-bound (H200, V4.1 widths: ~212 us per layer at T=1 for 113 MB). Here:

1. the T*k pairs are sorted by expert (``argsort``, stable; no blocks, no padding), so programs on the same
   expert run next to each other and share its weights through L2;
2. ``_up_gemv_kernel``: grid (P, F / BLOCK_N, SPLIT). The weights are read as int32 words
   ``[BLOCK_N rows, GROUPS, 4 words]`` (one MXFP4 group of 32 elements per 16-byte load); nibbles j and j+4
   of a word are decoded together into the two fp16 halves of one register with two shifts and a mask
   (``E2M1[c] * 2^-14``, the fp16 bit trick of ``triton_moe``) and converted to fp32 (inline PTX), multiplied
   in fp32 with activations pre-arranged as 8 planes (plane j: columns 8i+j; contiguous loads), summed
   inside the group and scaled once per group (2^14 and the power-of-two scale: exact). Gate and up sums
   of a K split go to fp32 partials ``[SPLIT, 2, P, F]``; with one split the kernel applies the clamped
   SwiGLU itself;
3. ``_act_kernel`` (SPLIT > 1): partials summed in split order, then the reference's roundings (gate/up to
   x.dtype, clamp, SiLU in fp32 rounded to x.dtype, product rounded to x.dtype); ``h`` is written as
   ``[P, 8, F/8]`` (the 8 planes), the layout the down kernel reads;
4. ``_down_gemv_kernel``: grid (P, D / BLOCK_N, SPLIT), fp32 partials ``[SPLIT, P, D]``;
5. ``_finish_kernel``: per token, for each slot in slot order: the split partials summed in split order,
   rounded to x.dtype (the reference's per-expert product), times the routing weight, added in fp32; cast.

Numerics: the same roundings as the grouped path and the reference; only summation orders differ (K in
groups of 32, then group tiles, then splits in fixed order). No host synchronisation: every shape and the
split factors follow from (T, k, E, D, F) on the host, so the path is captured in CUDA graphs.

Each weight element is decoded once per routed *pair* (the grouped path: once per 16-row block), so this
path loses when experts get several pairs each; ``moe_experts_mxfp4`` switches at ``SPLITK_PAIRS`` pairs.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_nvidia.kernels.triton_gemm import _ue8m0
from deepinfer_nvidia.kernels.triton_moe_common import _swiglu

# (block_n, groups of 32 K elements per iteration, warps, stages, programs to aim for with split-K, asm: the
# fp16 pair -> 2 x fp32 conversion as inline PTX (0: the same decode in plain Triton ops, also what the
# interpreter runs));
# H200 measurements in docs/performance.md (seventh pass); benchmarks may override.
SPLITK_TUNE: dict[str, int] = {"block_n": 16, "groups": 8, "warps": 4, "stages": 3, "programs": 2048, "asm": 1}
# Pairs (tokens x top-k) up to which ``moe.experts_mxfp4`` (provider triton) takes this path; 0 disables it.
# Measured on the H200 (docs/performance.md, ninth pass): the word version wins 1.41x at 384 pairs and ties at 768.
SPLITK_PAIRS = 512
# Pairs up to which the path keeps routing order instead of sorting by expert (no argsort / gather launches).
UNSORTED_PAIRS = 16


# 0x80008000 as int32: the sign bits of two fp16 halves. A module global read inside a jit function must be
# a ``tl.constexpr`` on the GPU compiler (the CPU interpreter does not check this).
SIGN2 = tl.constexpr(-2147450880)


@triton.jit
def _halves_f32(h2, ASM: tl.constexpr):
    """int32 holding two fp16 bit patterns -> (low half, high half) as fp32 (exact)."""
    if ASM:
        lo, hi = tl.inline_asm_elementwise(
            "{ .reg .b16 l, h; mov.b32 {l, h}, $2; cvt.f32.f16 $0, l; cvt.f32.f16 $1, h; }",
            "=r,=r,r", [h2], dtype=(tl.float32, tl.float32), is_pure=True, pack=1)
    else:
        lo = (h2 & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        hi = (h2 >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return lo, hi


@triton.jit
def _nibble_pair(w, J: tl.constexpr, ASM: tl.constexpr):
    """Words ``w`` (int32, 8 nibbles = elements 8i..8i+7): elements 8i+J and 8i+J+4 as fp32 ``E2M1 * 2^-14``.
    Nibbles J and J+4 move into both fp16 halves with the same two shifts: 3 integer ops per 2 elements."""
    if J < 3:
        a = w << (9 - 4 * J)
    else:
        a = w >> 3
    b = w << (12 - 4 * J)
    return _halves_f32((a & 0x0E000E00) | (b & SIGN2), ASM)


@triton.jit
def _gemv_tile(w_ptr, s_ptr, rn, nmask, rg, gmask, KG, x0, x1, x2, x3, x4, x5, x6, x7,
               BLOCK_N: tl.constexpr, GROUPS: tl.constexpr, ASM: tl.constexpr):
    """Rows ``rn`` x MXFP4 groups ``rg`` of a packed matrix viewed as int32 words [N, KG*4] (scales [N, KG])
    against the activation planes ``xj`` [GROUPS, 4] (fp32; plane j holds elements 8i+j): returns the
    per-group sums [BLOCK_N, GROUPS] (fp32, 2^14 and the power-of-two scale applied once per group)."""
    rw = tl.arange(0, 4)
    m2 = nmask[:, None] & gmask[None, :]
    off = rn[:, None].to(tl.int64) * KG + rg[None, :]
    w = tl.load(w_ptr + off[:, :, None] * 4 + rw[None, None, :], mask=m2[:, :, None], other=0)
    lo, hi = _nibble_pair(w, 0, ASM)
    part = lo * x0[None, :, :] + hi * x4[None, :, :]
    lo, hi = _nibble_pair(w, 1, ASM)
    part += lo * x1[None, :, :] + hi * x5[None, :, :]
    lo, hi = _nibble_pair(w, 2, ASM)
    part += lo * x2[None, :, :] + hi * x6[None, :, :]
    lo, hi = _nibble_pair(w, 3, ASM)
    part += lo * x3[None, :, :] + hi * x7[None, :, :]
    sb = tl.load(s_ptr + off, mask=m2, other=127).to(tl.int32)
    return (tl.sum(part, axis=2) * 16384.0) * _ue8m0(sb)


@triton.jit
def _planes(row_ptr, plane, rg, gmask):
    """The 8 activation planes of one row (plane j: elements 8i+j, ``plane`` elements each) for groups ``rg``:
    8 tensors [GROUPS, 4] in fp32."""
    xi = rg[:, None] * 4 + tl.arange(0, 4)[None, :]
    xm = gmask[:, None]
    return (tl.load(row_ptr + xi, mask=xm, other=0.0).to(tl.float32),
            tl.load(row_ptr + plane + xi, mask=xm, other=0.0).to(tl.float32),
            tl.load(row_ptr + 2 * plane + xi, mask=xm, other=0.0).to(tl.float32),
            tl.load(row_ptr + 3 * plane + xi, mask=xm, other=0.0).to(tl.float32),
            tl.load(row_ptr + 4 * plane + xi, mask=xm, other=0.0).to(tl.float32),
            tl.load(row_ptr + 5 * plane + xi, mask=xm, other=0.0).to(tl.float32),
            tl.load(row_ptr + 6 * plane + xi, mask=xm, other=0.0).to(tl.float32),
            tl.load(row_ptr + 7 * plane + xi, mask=xm, other=0.0).to(tl.float32))


@triton.jit
def _pair_expert(order_ptr, se_ptr, pid_p, SORTED: tl.constexpr):
    """The (token, slot) pair and expert of program ``pid_p`` (int64 both): the ``pid_p``-th of the pairs sorted by
    expert (``order``, with ``se`` the sorted experts), or with SORTED off the pairs in routing order (``se`` is
    ids.reshape(-1))."""
    if SORTED:
        pair = tl.load(order_ptr + pid_p).to(tl.int64)
    else:
        pair = pid_p.to(tl.int64)
    return pair, tl.load(se_ptr + pid_p).to(tl.int64)


@triton.jit
def _up_gemv_kernel(x8_ptr, order_ptr, se_ptr, w1_ptr, s1_ptr, w3_ptr, s3_ptr, part_ptr, h_ptr, P, D, F, limit,
                    g_per, TOPK: tl.constexpr, DIRECT: tl.constexpr, BLOCK_N: tl.constexpr, GROUPS: tl.constexpr,
                    ASM: tl.constexpr, SORTED: tl.constexpr):
    pid_p = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    pair, e = _pair_expert(order_ptr, se_ptr, pid_p, SORTED)
    tok = pair // TOPK
    KG = D // 32
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rn < F
    w1 = w1_ptr + e * F * (D // 8)
    w3 = w3_ptr + e * F * (D // 8)
    s1 = s1_ptr + e * F * KG
    s3 = s3_ptr + e * F * KG
    x_row = x8_ptr + tok * D
    acc1 = tl.zeros([BLOCK_N, GROUPS], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_N, GROUPS], dtype=tl.float32)
    g_lo = pid_k * g_per
    g_hi = tl.minimum(g_lo + g_per, KG)
    for g0 in range(g_lo, g_hi, GROUPS):
        rg = g0 + tl.arange(0, GROUPS)
        gmask = rg < g_hi
        x0, x1, x2, x3, x4, x5, x6, x7 = _planes(x_row, D // 8, rg, gmask)
        acc1 += _gemv_tile(w1, s1, rn, nmask, rg, gmask, KG, x0, x1, x2, x3, x4, x5, x6, x7, BLOCK_N, GROUPS, ASM)
        acc3 += _gemv_tile(w3, s3, rn, nmask, rg, gmask, KG, x0, x1, x2, x3, x4, x5, x6, x7, BLOCK_N, GROUPS, ASM)
    a1 = tl.sum(acc1, axis=1)
    a3 = tl.sum(acc3, axis=1)
    if DIRECT:
        h = _swiglu(a1, a3, limit, h_ptr.dtype.element_ty)
        tl.store(h_ptr + pair * F + (rn % 8) * (F // 8) + rn // 8, h, mask=nmask)
    else:
        base = part_ptr + (pid_k * 2 * P + pair) * F + rn
        tl.store(base, a1, mask=nmask)
        tl.store(base + P * F, a3, mask=nmask)


@triton.jit
def _act_kernel(part_ptr, h_ptr, P, F, SPLIT, limit, BLOCK: tl.constexpr):
    """h [P, 8, F/8] (plane j: columns 8i+j) = clamped SwiGLU of the split-order sums of the gate / up partials."""
    p = tl.program_id(0).to(tl.int64)
    rf = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = rf < F
    a1 = tl.zeros([BLOCK], dtype=tl.float32)
    a3 = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(SPLIT):
        base = part_ptr + (s * 2 * P + p) * F + rf
        a1 += tl.load(base, mask=m, other=0.0)
        a3 += tl.load(base + P * F, mask=m, other=0.0)
    h = _swiglu(a1, a3, limit, h_ptr.dtype.element_ty)
    tl.store(h_ptr + p * F + (rf % 8) * (F // 8) + rf // 8, h, mask=m)


@triton.jit
def _down_gemv_kernel(h_ptr, order_ptr, se_ptr, w2_ptr, s2_ptr, part_ptr, P, D, F, g_per,
                      BLOCK_N: tl.constexpr, GROUPS: tl.constexpr, ASM: tl.constexpr, SORTED: tl.constexpr):
    pid_p = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    pair, e = _pair_expert(order_ptr, se_ptr, pid_p, SORTED)
    KG = F // 32
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rn < D
    w2 = w2_ptr + e * D * (F // 8)
    s2 = s2_ptr + e * D * KG
    h_row = h_ptr + pair * F
    acc = tl.zeros([BLOCK_N, GROUPS], dtype=tl.float32)
    g_lo = pid_k * g_per
    g_hi = tl.minimum(g_lo + g_per, KG)
    for g0 in range(g_lo, g_hi, GROUPS):
        rg = g0 + tl.arange(0, GROUPS)
        gmask = rg < g_hi
        h0, h1, h2, h3, h4, h5, h6, h7 = _planes(h_row, F // 8, rg, gmask)
        acc += _gemv_tile(w2, s2, rn, nmask, rg, gmask, KG, h0, h1, h2, h3, h4, h5, h6, h7, BLOCK_N, GROUPS, ASM)
    tl.store(part_ptr + (pid_k * P + pair) * D + rn, tl.sum(acc, axis=1), mask=nmask)


@triton.jit
def _finish_kernel(part_ptr, wt_ptr, out_ptr, P, D, SPLIT, TOPK: tl.constexpr, BLOCK: tl.constexpr):
    """out [T, D] = sum over slots j (in order) of round(sum over splits (in order) of part[s, t*k+j]) * wt."""
    t = tl.program_id(0).to(tl.int64)
    rn = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = rn < D
    dtype = out_ptr.dtype.element_ty
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for j in range(TOPK):
        p = t * TOPK + j
        y = tl.zeros([BLOCK], dtype=tl.float32)
        for s in range(SPLIT):
            y += tl.load(part_ptr + (s * P + p) * D + rn, mask=m, other=0.0)
        acc += y.to(dtype).to(tl.float32) * tl.load(wt_ptr + p)
    tl.store(out_ptr + t * D + rn, acc.to(dtype), mask=m)


def split_for(pairs: int, n: int, kg: int, block_n: int, groups: int, programs: int) -> tuple[int, int]:
    """(split, groups per split) for ``pairs`` x ceil(n / block_n) programs over ``kg`` MXFP4 groups of K:
    the smallest power of two reaching ``programs`` programs, each split keeping >= 2 iterations."""
    base = pairs * triton.cdiv(n, block_n)
    iters = triton.cdiv(kg, groups)
    split = 1
    while base * split < programs and iters // (split * 2) >= 2:
        split *= 2
    g_per = triton.cdiv(triton.cdiv(kg, split), groups) * groups
    return triton.cdiv(kg, g_per), g_per


def splitk_mxfp4(x, weights, ids, w1, s1, w3, s3, w2, s2, limit, block_n: int | None = None,
                 groups: int | None = None, warps: int | None = None, stages: int | None = None,
                 programs: int | None = None, asm: int | None = None) -> torch.Tensor:
    """The decode path (no host sync). Operands already validated by ``triton_moe`` (x [T, D] on CUDA, MXFP4
    stacks [E, F, D/2] / [E, D, F/2] with UE8M0 scales, D and F multiples of 32, T*k > 0). Keyword arguments:
    tuning knobs (defaults: ``SPLITK_TUNE``)."""
    t, d = x.shape
    k = ids.shape[1]
    f = w1.shape[1]
    p = t * k
    tune = SPLITK_TUNE
    bn = block_n or tune["block_n"]
    gr = groups or tune["groups"]
    nw = warps or tune["warps"]
    ns = stages or tune["stages"]
    target = programs or tune["programs"]
    use_asm = bool(tune["asm"] if asm is None else asm)
    dev = x.device
    flat = ids.reshape(-1)
    # pairs grouped by expert, so programs on one expert share its weights through L2; a handful of pairs
    # rarely repeats an expert, and the radix sort + gather cost ~10 us of a ~75 us layer at batch 1
    sort = p > UNSORTED_PAIRS
    order = torch.argsort(flat, stable=True) if sort else flat
    se = flat.index_select(0, order) if sort else flat
    x8 = x.reshape(t, d // 8, 8).transpose(1, 2).contiguous()  # [T, 8, D/8]: plane j holds columns 8i+j
    u8 = [a.view(torch.uint8) for a in (w1, s1, w3, s3, w2, s2)]
    for i in (0, 2, 4):
        u8[i] = u8[i].view(torch.int32)  # 8 nibbles per word
    h = torch.empty(p, f, dtype=x.dtype, device=dev)  # [P, 8, F/8]
    sp1, gp1 = split_for(p, f, d // 32, bn, gr, target)
    part1 = torch.empty(2 * sp1 * p * f if sp1 > 1 else 1, dtype=torch.float32, device=dev)
    _up_gemv_kernel[(p, triton.cdiv(f, bn), sp1)](x8, order, se, u8[0], u8[1], u8[2], u8[3], part1, h, p, d, f,
                                                  float(limit), gp1, TOPK=k, DIRECT=sp1 == 1, BLOCK_N=bn,
                                                  GROUPS=gr, ASM=use_asm, SORTED=sort, num_warps=nw,
                                                  num_stages=ns)
    if sp1 > 1:
        blk = min(1024, max(128, triton.next_power_of_2(f)))
        _act_kernel[(p, triton.cdiv(f, blk))](part1, h, p, f, sp1, float(limit), BLOCK=blk, num_warps=4)
    sp2, gp2 = split_for(p, d, f // 32, bn, gr, target)
    part2 = torch.empty(sp2 * p * d, dtype=torch.float32, device=dev)
    _down_gemv_kernel[(p, triton.cdiv(d, bn), sp2)](h, order, se, u8[4], u8[5], part2, p, d, f, gp2, BLOCK_N=bn,
                                                    GROUPS=gr, ASM=use_asm, SORTED=sort, num_warps=nw,
                                                    num_stages=ns)
    out = torch.empty(t, d, dtype=x.dtype, device=dev)
    wt = weights.reshape(-1).float().contiguous()
    blk = min(1024, max(128, triton.next_power_of_2(d)))
    _finish_kernel[(t, triton.cdiv(d, blk))](part2, wt, out, p, d, sp2, TOPK=k, BLOCK=blk, num_warps=4)
    return out
