"""Triton mHC mix weights (``mhc.mix``): fused RMS + projection, then gates and Sinkhorn.

Two launches instead of the reference's ~70 small ops:

1. ``_proj_kernel``: ``BLOCK_T`` tokens x one K range per program (split-K when
   few tokens, so the 24 x n*D fp32 ``fn`` matrix is streamed by many SMs). It
   reads the flattened residual once, accumulates ``sum(x^2)`` and the
   projection ``x . fn^T`` (full-fp32 dot) into fp32 partials.
   Prefill-sized launches (``TF32X3_MIN_T`` tokens or more) take the dot on the tensor cores: the
   full-fp32 dot runs on the CUDA cores at ~8% of their FMA rate, 2.07 ms per call at 8192 tokens on
   the H200 (thirteenth pass, docs/performance.md). A bf16 residual is exact in bf16, so ``fn`` is
   split into three bf16 pieces (~24 significant bits together) and the dot is three bf16 products
   with fp32 accumulation (sixteenth pass); an fp32 / fp16 residual takes three TF32 products
   (``tf32x3``: hi*hi + hi*lo + lo*hi, ~21 mantissa bits per product).
2. ``_gate_kernel``: one program per token sums the partials in fixed order,
   applies the RMS factor (``fn . (x * r) == (fn . x) * r``), the sigmoid gates,
   the row softmax of the n x n block and ``sinkhorn_iters`` Sinkhorn
   normalisations, all in registers.

n (hc_mult) must be a power of two (V4 uses 4) so the n x n block is a
register tile without padding inside the softmax.

``mix_bi`` (provider ``triton_bi``) is the batch-invariant launch: the default picks
``BLOCK_T`` and the split count from T; the variant uses ``BI_BLOCK_T`` rows per program and a
split taken from n*D alone, so a token's partial sums cover the same K ranges in the same order
in any batch. ``collapse`` and ``expand`` are invariant as they are (one program per token and
D tile, fixed sums over n).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from deepinfer_core.kernels.ops.mhc import mhc_collapse, mhc_collapse_norm, mhc_expand, mhc_head_pre, mhc_mix
from deepinfer_nvidia.kernels._common import FLOATS, hand_off, next_pow2, on_cuda
from deepinfer_nvidia.kernels.triton_norm import rms
from deepinfer_nvidia.kernels.triton_pdl import pdl_enter, pdl_launch


@triton.jit
def bf16_pieces_dot(x, f):
    """``x . f^T`` to fp32 accuracy on the bf16 tensor cores: x bf16 [M, K] (exact in bf16), f fp32 [N, K] ->
    fp32 [M, N]. f = f1 + f2 + f3 (three bf16 pieces, rounded to nearest, ~24 significant bits together), three
    bf16 products with fp32 accumulation, starting from zero."""
    f1 = f.to(tl.bfloat16)
    r1 = f - f1.to(tl.float32)
    f2 = r1.to(tl.bfloat16)
    f3 = (r1 - f2.to(tl.float32)).to(tl.bfloat16)
    part = tl.dot(x, tl.trans(f3))
    part = tl.dot(x, tl.trans(f2), part)
    return tl.dot(x, tl.trans(f1), part)


@triton.jit
def _proj_kernel(x_ptr, fn_ptr, part_ptr, ss_ptr, T, K, R, k_per_split,
                 NR: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr = "ieee",
                 SPLIT_FN: tl.constexpr = False, PDL: tl.constexpr = 0):
    pdl_enter(PDL)
    pid_t = tl.program_id(0)
    sp = tl.program_id(1)
    rt = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    rr = tl.arange(0, NR)
    tmask = rt < T
    rmask = rr < R
    acc = tl.zeros([BLOCK_T, NR], dtype=tl.float32)
    ss = tl.zeros([BLOCK_T], dtype=tl.float32)
    k_lo = sp * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        kmask = rk < k_hi
        x = tl.load(x_ptr + rt[:, None].to(tl.int64) * K + rk[None, :], mask=tmask[:, None] & kmask[None, :],
                    other=0.0)
        f = tl.load(fn_ptr + rr[:, None].to(tl.int64) * K + rk[None, :], mask=rmask[:, None] & kmask[None, :],
                    other=0.0)
        xf = x.to(tl.float32)
        ss += tl.sum(xf * xf, axis=1)
        if SPLIT_FN:
            # the tensor cores' own accumulation is not IEEE fp32 (chained over a whole K range the error grew
            # to 3e-5 with the K range: pass16a), so each K tile's three products start from zero and are
            # added to acc in fp32 on the CUDA cores
            acc += bf16_pieces_dot(x, f)
        else:
            acc += tl.dot(xf, tl.trans(f), input_precision=PRECISION)
    off = (sp * T + rt[:, None]).to(tl.int64) * NR + rr[None, :]
    tl.store(part_ptr + off, acc, mask=tmask[:, None])
    tl.store(ss_ptr + sp * T + rt, ss, mask=tmask)


@triton.jit
def _gate_math(part_ptr, ss_ptr, base_ptr, scale_ptr, t, T, K, n, norm_eps, hc_eps, iters,
               NR: tl.constexpr, NP: tl.constexpr, SPLITS: tl.constexpr):
    """Token ``t``'s mix weights from the projection partials ``part [SPLITS, T, NR]`` and the sums of squares
    ``ss [SPLITS, T]``: fp32 ``pre [NP]``, ``post [NP]``, ``comb [NP, NP]`` (rows i, columns j; lanes >= n are
    not weights: masked stores only)."""
    s = tl.arange(0, SPLITS)
    ss = tl.sum(tl.load(ss_ptr + s * T + t), axis=0)
    r = 1.0 / tl.sqrt(ss / K + norm_eps)
    sc0 = tl.load(scale_ptr)
    sc1 = tl.load(scale_ptr + 1)
    sc2 = tl.load(scale_ptr + 2)
    i = tl.arange(0, NP)
    imask = i < n
    prow = (s[:, None] * T + t).to(tl.int64) * NR  # [SPLITS, 1]
    # pre / post: columns [0, n) and [n, 2n) of the projection
    m_pre = tl.sum(tl.load(part_ptr + prow + i[None, :], mask=imask[None, :], other=0.0), axis=0) * r
    m_post = tl.sum(tl.load(part_ptr + prow + n + i[None, :], mask=imask[None, :], other=0.0), axis=0) * r
    b_pre = tl.load(base_ptr + i, mask=imask, other=0.0)
    b_post = tl.load(base_ptr + n + i, mask=imask, other=0.0)
    pre = tl.sigmoid(m_pre * sc0 + b_pre) + hc_eps
    post = 2.0 * tl.sigmoid(m_post * sc1 + b_post)
    # comb: columns [2n, 2n + n*n) as an n x n block, rows i, columns j
    j = tl.arange(0, NP)
    cmask = imask[:, None] & (j[None, :] < n)
    cidx = 2 * n + i[:, None] * n + j[None, :]
    prow3 = (s[:, None, None] * T + t).to(tl.int64) * NR
    m_c = tl.sum(tl.load(part_ptr + prow3 + cidx[None, :, :], mask=cmask[None, :, :], other=0.0), axis=0) * r
    z = m_c * sc2 + tl.load(base_ptr + cidx, mask=cmask, other=0.0)
    z = tl.where(cmask, z, float("-inf"))
    z = tl.exp(z - tl.max(z, axis=1)[:, None])
    z = tl.where(cmask, z, 0.0)
    c = z / tl.where(imask, tl.sum(z, axis=1), 1.0)[:, None]
    c = tl.where(cmask, c + hc_eps, 0.0)
    c = c / (tl.sum(c, axis=0)[None, :] + hc_eps)
    for _ in range(iters - 1):
        c = c / (tl.sum(c, axis=1)[:, None] + hc_eps)
        c = c / (tl.sum(c, axis=0)[None, :] + hc_eps)
    return pre, post, c


@triton.jit
def _store_weights(pre_ptr, post_ptr, comb_ptr, t, n, pre, post, c, NP: tl.constexpr):
    """Store token ``t``'s ``pre [n]``, ``post [n]`` and ``comb [n, n]`` (from ``_gate_math``'s padded tiles)."""
    i = tl.arange(0, NP)
    imask = i < n
    tl.store(pre_ptr + t * n + i, pre, mask=imask)
    tl.store(post_ptr + t * n + i, post, mask=imask)
    tl.store(comb_ptr + t * n * n + i[:, None] * n + i[None, :], c, mask=imask[:, None] & imask[None, :])


@triton.jit
def _gate_kernel(part_ptr, ss_ptr, base_ptr, scale_ptr, pre_ptr, post_ptr, comb_ptr, T, K, n, norm_eps, hc_eps,
                 iters, NR: tl.constexpr, NP: tl.constexpr, SPLITS: tl.constexpr, PDL: tl.constexpr = 0):
    pdl_enter(PDL)
    t = tl.program_id(0)
    pre, post, c = _gate_math(part_ptr, ss_ptr, base_ptr, scale_ptr, t, T, K, n, norm_eps, hc_eps, iters,
                              NR=NR, NP=NP, SPLITS=SPLITS)
    _store_weights(pre_ptr, post_ptr, comb_ptr, t, n, pre, post, c, NP=NP)


def supports(residual, fn, base, scale, norm_eps, hc_eps, sinkhorn_iters) -> bool:
    """CUDA residual [T, n, D] (fp32/bf16/fp16, n a power of two <= 8) with fp32 fn/base/scale."""
    if not on_cuda(residual, fn, base, scale) or residual.dtype not in FLOATS or residual.dim() != 3:
        return False
    n = residual.shape[1]
    return (n & (n - 1)) == 0 and 1 <= n <= 8 and fn.dtype == base.dtype == scale.dtype == torch.float32


BI_BLOCK_T = 16  # tokens per projection program in the batch-invariant launch
TF32X3_MIN_T = 1024  # tokens from which the default launch's projection runs as tf32x3 (decode sizes keep ieee)
# The prefill launch's (BLOCK_T, BLOCK_K, num_warps, num_stages); its split is taken to fill ~2 waves of SMs.
# Measured on the H200 (docs/performance.md, sixteenth pass).
PREFILL_LAUNCH = (128, 64, 8, 3)
# Prefill with a bf16 residual: fn split into three bf16 pieces, three bf16 tensor-core products (x is exact in
# bf16), instead of tf32x3 on an fp32 copy of x. False keeps tf32x3 (benchmarks compare the two).
SPLIT_FN_BF16 = True
# Decode-sized default launches (below TF32X3_MIN_T tokens) with DECODE_SPLIT_FN: a bf16 residual takes the
# bf16-pieces product there too, with at most DECODE_MAX_SPLITS K splits (the tensor-core dot makes 5-tile
# programs with a DECODE_STAGES pipeline cheaper than 256 one-tile ones) and DECODE_GATE_WARPS warps summing them
# per token. H200, one call (projection + gate, CUDA graph): 21.7 -> 15.2 us at 1 token, 22.7 -> 15.0 at 8,
# 28.0 -> 20.0 at 64, errors unchanged (pass16i, docs/performance.md sixteenth pass). On since the device
# conformance test and the V4.1 sweep ran with it (seventeenth pass: the 8-layer graphed batch-1 step's
# projection 183 -> 87 us, gate 105 -> 84 us, pipelined step 3.23 -> 3.12 ms). fp32 / fp16
# residuals and the batch-invariant launch always keep the ieee dot, one gate warp and their splits.
# DECODE_GATE_WARPS 4 -> 1 (twenty-fourth pass, ``bench_decode_small``: a call in a CUDA graph of 20, 8.08 -> 7.52 us
# at 1 token, 8.27 -> 7.55 at 8): the gate's 19 Sinkhorn rounds are a chain of intra-warp reductions on a 4 x 4 tile,
# and with 4 warps the sum over the splits adds 13 CTA barriers (SASS, Triton 3.6) that one warp does not need.
DECODE_SPLIT_FN = True
DECODE_MAX_SPLITS = 64
DECODE_STAGES = 3
DECODE_GATE_WARPS = 1


def mix(residual: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, norm_eps: float,
        hc_eps: float, sinkhorn_iters: int, batch_invariant: bool = False, force_kernel: bool = False,
        prefill_launch: tuple | None = None, decode_launch: dict | None = None):
    """``mhc.mix``: returns fp32 ``pre [T, n]``, ``post [T, n]``, ``comb [T, n, n]`` (see the reference).

    ``batch_invariant``: tiles and split from (n, D) only (``mix_bi``). ``force_kernel`` runs on CPU tensors
    (Triton's interpreter, tests only). ``prefill_launch`` overrides ``PREFILL_LAUNCH``; ``decode_launch``
    (keys ``splits`` (a power of two), ``stages``, ``split_fn``, ``gate_warps``) the decode-sized default launch
    (benchmarks, tests)."""
    if not (supports(residual, fn, base, scale, norm_eps, hc_eps, sinkhorn_iters) or force_kernel):
        return hand_off("mhc.mix", f"operands residual {residual.dtype} {tuple(residual.shape)} on "
                        f"{residual.device} not covered", mhc_mix, residual, fn, base, scale, norm_eps, hc_eps,
                        sinkhorn_iters)
    t, n, d = residual.shape
    rows, kdim = (2 + n) * n, n * d
    if fn.shape != (rows, kdim) or base.shape != (rows,) or scale.shape != (3,):
        raise ValueError(f"mhc.mix: for residual [T, {n}, {d}] expected fn [{rows}, {kdim}], base [{rows}], "
                         f"scale [3]; got {tuple(fn.shape)}, {tuple(base.shape)}, {tuple(scale.shape)}")
    if int(sinkhorn_iters) < 1:
        raise ValueError(f"mhc.mix: sinkhorn_iters must be >= 1, got {sinkhorn_iters}")
    dev = residual.device
    pre = torch.empty(t, n, dtype=torch.float32, device=dev)
    post = torch.empty(t, n, dtype=torch.float32, device=dev)
    comb = torch.empty(t, n, n, dtype=torch.float32, device=dev)
    if t == 0:
        return pre, post, comb
    x = residual.contiguous()
    nr = max(16, next_pow2(rows))
    bk, warps, stages = 128, 4, None
    prefill = t >= TF32X3_MIN_T and not batch_invariant
    if prefill:
        bt, bk, warps, stages = prefill_launch or PREFILL_LAUNCH
        tiles_for_split = triton.cdiv(t, bt)
    elif batch_invariant:
        # fixed rows per program; the split is the one batch 1 gets, computed from n*D alone
        bt, tiles_for_split = BI_BLOCK_T, 1
    else:
        bt = 16 if t <= 16 else 32
        tiles_for_split = triton.cdiv(t, bt)
    tiles = triton.cdiv(t, bt)
    splits = 1
    if batch_invariant:
        while tiles_for_split * splits < 132 and kdim // (splits * 2) >= 4 * bk and splits < 64:
            splits *= 2
    else:
        # decode: the 24 x n*D fp32 matrix (2 MB at V4.1 widths) is the whole cost, so spread it over ~2 waves
        # of programs. One token tile (T <= 32) goes down to one K tile per program (H200, T=1: 32 splits of 5
        # tiles took 25 us per call, 64 of 3 16 us, 256 splits 11.4 us, the gate's sum of 256 partials +2 us:
        # thirteenth pass); more token tiles keep >= 2 K tiles per program (at T=64, 256 splits lost ~30 us
        # per step in the gate kernel against 64)
        if tiles_for_split == 1:
            while splits < min(256, next_pow2(triton.cdiv(kdim, bk))):
                splits *= 2
        else:
            while tiles_for_split * splits < 264 and kdim // (splits * 2) >= 2 * bk and splits < 128:
                splits *= 2
    decode = not (prefill or batch_invariant)
    dl = (decode_launch or {}) if decode else {}
    split_fn = x.dtype == torch.bfloat16 and (SPLIT_FN_BF16 if prefill else
                                              decode and dl.get("split_fn", DECODE_SPLIT_FN))
    gate_warps = 1
    if decode and split_fn:
        splits, stages, gate_warps = min(splits, DECODE_MAX_SPLITS), DECODE_STAGES, DECODE_GATE_WARPS
    if decode:
        splits, stages = dl.get("splits", splits), dl.get("stages", stages)
        gate_warps = dl.get("gate_warps", gate_warps)
    if splits & (splits - 1):
        raise ValueError(f"mhc.mix: splits must be a power of two, got {splits}")
    k_per = triton.cdiv(triton.cdiv(kdim, splits), bk) * bk
    part = torch.empty(splits, t, nr, dtype=torch.float32, device=dev)
    ss = torch.empty(splits, t, dtype=torch.float32, device=dev)
    opts = {"num_warps": warps} if stages is None else {"num_warps": warps, "num_stages": stages}
    _proj_kernel[(tiles, splits)](x, fn.contiguous(), part, ss, t, kdim, rows, k_per, NR=nr, BLOCK_T=bt,
                                  BLOCK_K=bk, PRECISION="tf32x3" if prefill else "ieee", SPLIT_FN=split_fn, **opts,
                                  **pdl_launch())
    _gate_kernel[(t,)](part, ss, base.contiguous(), scale.contiguous(), pre, post, comb, t, kdim, n,
                       float(norm_eps), float(hc_eps), int(sinkhorn_iters), NR=nr, NP=max(2, n), SPLITS=splits,
                       num_warps=gate_warps, **pdl_launch())
    return pre, post, comb


def mix_bi(residual: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, norm_eps: float,
           hc_eps: float, sinkhorn_iters: int):
    """``mhc.mix``, batch-invariant (residual [T, n, D] -> fp32 pre [T, n], post [T, n], comb [T, n, n])."""
    return mix(residual, fn, base, scale, norm_eps, hc_eps, sinkhorn_iters, batch_invariant=True)


# -- mhc.head_pre: the final head's collapse weights (the reference runs ~7 small ops) ----------------------
@triton.jit
def _head_gate_kernel(part_ptr, ss_ptr, base_ptr, scale_ptr, out_ptr, T, K, n, norm_eps, hc_eps,
                      NR: tl.constexpr, NP: tl.constexpr, SPLITS: tl.constexpr, PDL: tl.constexpr = 0):
    pdl_enter(PDL)
    t = tl.program_id(0)
    s = tl.arange(0, SPLITS)
    r = 1.0 / tl.sqrt(tl.sum(tl.load(ss_ptr + s * T + t), axis=0) / K + norm_eps)
    i = tl.arange(0, NP)
    imask = i < n
    prow = (s[:, None] * T + t).to(tl.int64) * NR
    m = tl.sum(tl.load(part_ptr + prow + i[None, :], mask=imask[None, :], other=0.0), axis=0) * r
    z = m * tl.load(scale_ptr) + tl.load(base_ptr + i, mask=imask, other=0.0)
    tl.store(out_ptr + t * n + i, tl.sigmoid(z) + hc_eps, mask=imask)


def supports_head(residual, fn, base, scale, norm_eps, hc_eps) -> bool:
    """CUDA residual [T, n, D] (fp32/bf16/fp16, n <= 16) with fp32 fn [n, n*D], base [n], scale [1]."""
    return (on_cuda(residual, fn, base, scale) and residual.dtype in FLOATS and residual.dim() == 3
            and residual.shape[1] <= 16 and fn.dtype == base.dtype == scale.dtype == torch.float32)


def head_pre(residual: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, norm_eps: float,
             hc_eps: float, force_kernel: bool = False) -> torch.Tensor:
    """``mhc.head_pre``: residual [T, n, D] -> fp32 [T, n], ``sigmoid(scale * fn . rms(vec(R)) + base) + hc_eps``.

    Two launches: ``_proj_kernel`` (split-K projection + sum of squares, the split taken from n*D alone and 16
    tokens per program, so a token's sums never depend on the batch) and one program per token for the RMS
    factor and the gate. ``force_kernel`` runs on CPU tensors (Triton's interpreter, tests only)."""
    if not (supports_head(residual, fn, base, scale, norm_eps, hc_eps) or force_kernel):
        return hand_off("mhc.head_pre", f"operands residual {residual.dtype} on {residual.device} not covered",
                        mhc_head_pre, residual, fn, base, scale, norm_eps, hc_eps)
    t, n, d = residual.shape
    kdim = n * d
    if fn.shape != (n, kdim) or base.shape != (n,) or scale.numel() != 1:
        raise ValueError(f"mhc.head_pre: for residual [T, {n}, {d}] expected fn [{n}, {kdim}], base [{n}], "
                         f"scale [1]; got {tuple(fn.shape)}, {tuple(base.shape)}, {tuple(scale.shape)}")
    out = torch.empty(t, n, dtype=torch.float32, device=residual.device)
    if t == 0:
        return out
    nr, bk, bt = max(16, next_pow2(n)), 128, BI_BLOCK_T
    splits = 1
    while splits < 132 and kdim // (splits * 2) >= 4 * bk and splits < 64:
        splits *= 2
    k_per = triton.cdiv(triton.cdiv(kdim, splits), bk) * bk
    part = torch.empty(splits, t, nr, dtype=torch.float32, device=residual.device)
    ss = torch.empty(splits, t, dtype=torch.float32, device=residual.device)
    _proj_kernel[(triton.cdiv(t, bt), splits)](residual.contiguous(), fn.contiguous(), part, ss, t, kdim, n, k_per,
                                               NR=nr, BLOCK_T=bt, BLOCK_K=bk, num_warps=4, **pdl_launch())
    _head_gate_kernel[(t,)](part, ss, base.contiguous(), scale.reshape(1).contiguous(), out, t, kdim, n,
                            float(norm_eps), float(hc_eps), NR=nr, NP=max(2, next_pow2(n)), SPLITS=splits,
                            num_warps=1, **pdl_launch())
    return out


# -- mhc.collapse / mhc.expand: one launch each (the references run 4 and ~8 small ops) ---------------
@triton.jit
def _collapse_kernel(r_ptr, pre_ptr, out_ptr, n, D, NP: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr = 0):
    """out[t, d] = sum_k pre[t, k] * R[t, k, d] (fp32, k in order), one program per (token, D tile)."""
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    rd = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    k = tl.arange(0, NP)
    km = k < n
    dm = rd < D
    r = tl.load(r_ptr + t * n * D + k[:, None] * D + rd[None, :], mask=km[:, None] & dm[None, :], other=0.0)
    p = tl.load(pre_ptr + t * n + k, mask=km, other=0.0).to(tl.float32)
    out = tl.sum(p[:, None] * r.to(tl.float32), axis=0)
    tl.store(out_ptr + t * D + rd, out.to(out_ptr.dtype.element_ty), mask=dm)


@triton.jit
def _expand_kernel(r_ptr, y_ptr, y2_ptr, post_ptr, comb_ptr, out_ptr, n, D, NP: tl.constexpr, BLOCK_D: tl.constexpr,
                   TWO_PARTS: tl.constexpr = False, PDL: tl.constexpr = 0):
    """out[t, j, d] = post[t, j] * y[t, d] + sum_i comb[t, i, j] * R[t, i, d] (fp32). ``TWO_PARTS``: y is
    y[t, d] + y2[t, d], added in fp32 (the MoE's routed and shared outputs)."""
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    rd = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    i = tl.arange(0, NP)
    im = i < n
    dm = rd < D
    r = tl.load(r_ptr + t * n * D + i[:, None] * D + rd[None, :], mask=im[:, None] & dm[None, :],
                other=0.0).to(tl.float32)
    y = tl.load(y_ptr + t * D + rd, mask=dm, other=0.0).to(tl.float32)
    if TWO_PARTS:
        y += tl.load(y2_ptr + t * D + rd, mask=dm, other=0.0).to(tl.float32)
    post = tl.load(post_ptr + t * n + i, mask=im, other=0.0).to(tl.float32)
    c = tl.load(comb_ptr + t * n * n + i[:, None] * n + i[None, :], mask=im[:, None] & im[None, :],
                other=0.0).to(tl.float32)  # [i, j]
    mixed = tl.sum(c[:, :, None] * r[:, None, :], axis=0)  # [j, BLOCK_D]
    out = post[:, None] * y[None, :] + mixed
    tl.store(out_ptr + t * n * D + i[:, None] * D + rd[None, :], out.to(out_ptr.dtype.element_ty),
             mask=im[:, None] & dm[None, :])


@triton.jit
def _collapse_norm_kernel(r_ptr, pre_ptr, w_ptr, h_ptr, n, D, eps, NP: tl.constexpr, BLOCK_D: tl.constexpr,
                          PDL: tl.constexpr = 0):
    """h[t] = w * x / sqrt(mean(x^2) + eps), x = sum_k pre[t, k] * R[t, k] rounded to h's dtype (as
    ``mhc.collapse`` stores it), one program per token with the whole [n, D] row in registers."""
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    k = tl.arange(0, NP)
    km = k < n
    dm = d < D
    r = tl.load(r_ptr + t * n * D + k[:, None] * D + d[None, :], mask=km[:, None] & dm[None, :], other=0.0)
    p = tl.load(pre_ptr + t * n + k, mask=km, other=0.0).to(tl.float32)
    x = tl.sum(p[:, None] * r.to(tl.float32), axis=0).to(h_ptr.dtype.element_ty).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
    w = tl.load(w_ptr + d, mask=dm, other=0.0).to(tl.float32)
    tl.store(h_ptr + t * D + d, (w * (x * inv)).to(h_ptr.dtype.element_ty), mask=dm)


def _small_floats(*ts) -> bool:
    return all(t.dtype in FLOATS for t in ts)


def supports_collapse(residual, pre) -> bool:
    return (on_cuda(residual, pre) and _small_floats(residual, pre) and residual.dim() == 3 and pre.dim() == 2
            and residual.shape[1] <= 16)


def collapse(residual: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """``mhc.collapse``: residual [T, n, D], pre [T, n] -> [T, D] in residual.dtype (fp32 accumulation)."""
    if not supports_collapse(residual, pre):
        return hand_off("mhc.collapse", f"operands {residual.dtype}/{pre.dtype} on {residual.device} not covered",
                        mhc_collapse, residual, pre)
    t, n, d = residual.shape
    if tuple(pre.shape) != (t, n):
        raise ValueError(f"mhc.collapse: pre must be [{t}, {n}] for residual {tuple(residual.shape)}, "
                         f"got {tuple(pre.shape)}")
    out = torch.empty(t, d, dtype=residual.dtype, device=residual.device)
    if t and d:
        bd = min(1024, next_pow2(d))
        _collapse_kernel[(t, triton.cdiv(d, bd))](residual.contiguous(), pre.contiguous(), out, n, d,
                                                  NP=max(2, next_pow2(n)), BLOCK_D=bd, num_warps=4, **pdl_launch())
    return out


def _parts(y) -> tuple:
    """``mhc.expand``'s y as a tuple of parts (one tensor: one part)."""
    return (y,) if isinstance(y, torch.Tensor) else tuple(y)


# ``mhc.collapse_norm`` holds a token's [n, D] row in one program: up to this many elements (n x next_pow2(D)),
# over COLLAPSE_NORM_WARPS warps (V4.1: 4 x 8192, 64 fp32 a thread); wider rows take the two part launches.
COLLAPSE_NORM_MAX = 32768
COLLAPSE_NORM_WARPS = 16
# ``DEEPINFER_NV_COLLAPSE_NORM=0``: every call takes the two part launches (the A/B baseline of docs/performance.md,
# thirty-sixth pass).
COLLAPSE_NORM_KERNEL = os.environ.get("DEEPINFER_NV_COLLAPSE_NORM", "1") == "1"


def supports_collapse_norm(residual, pre, norm_w, norm_eps) -> bool:
    """Taken for every CUDA call the parts cover (the kernel's or the parts' launches); others: the reference."""
    return supports_collapse(residual, pre) and on_cuda(norm_w) and norm_w.dim() == 1


def collapse_norm(residual: torch.Tensor, pre: torch.Tensor, norm_w: torch.Tensor, norm_eps: float,
                  force_kernel: bool = False) -> torch.Tensor:
    """``mhc.collapse_norm``: residual [T, n, D], pre [T, n], norm_w [D] -> h [T, D] in residual.dtype, one launch
    where the row fits one program (``COLLAPSE_NORM_MAX``), else (or with ``COLLAPSE_NORM_KERNEL`` off) the parts:
    ``collapse`` and ``triton_norm.rms``, two dependent launches. ``force_kernel``: CPU tensors in Triton's
    interpreter (tests only)."""
    if not (force_kernel or supports_collapse_norm(residual, pre, norm_w, norm_eps)):
        return hand_off("mhc.collapse_norm", f"operands {residual.dtype} {tuple(residual.shape)} on {residual.device} "
                        "not covered", mhc_collapse_norm, residual, pre, norm_w, norm_eps)
    fits = max(2, next_pow2(residual.shape[1])) * next_pow2(residual.shape[2]) <= COLLAPSE_NORM_MAX
    if not force_kernel and not (COLLAPSE_NORM_KERNEL and fits):
        return rms(collapse(residual, pre), norm_w, norm_eps)
    t, n, d = residual.shape
    if tuple(pre.shape) != (t, n) or tuple(norm_w.shape) != (d,):
        raise ValueError(f"mhc.collapse_norm: for residual {tuple(residual.shape)} expected pre [{t}, {n}] and "
                         f"norm_w [{d}]; got {tuple(pre.shape)}, {tuple(norm_w.shape)}")
    h = torch.empty(t, d, dtype=residual.dtype, device=residual.device)
    if t and d:
        _collapse_norm_kernel[(t,)](residual.contiguous(), pre.contiguous(), norm_w.contiguous(), h, n, d,
                                    float(norm_eps), NP=max(2, next_pow2(n)), BLOCK_D=next_pow2(d),
                                    num_warps=COLLAPSE_NORM_WARPS, **pdl_launch())
    return h


def supports_expand(residual, y, post, comb) -> bool:
    """CUDA floats, residual [T, n <= 16, D]; y one tensor or two parts (more parts: the reference)."""
    parts = _parts(y)
    return (1 <= len(parts) <= 2 and all(isinstance(p, torch.Tensor) for p in parts)
            and on_cuda(residual, *parts, post, comb) and _small_floats(residual, *parts, post, comb)
            and residual.dim() == 3 and residual.shape[1] <= 16)


def expand(residual: torch.Tensor, y, post: torch.Tensor, comb: torch.Tensor, force_kernel: bool = False
           ) -> torch.Tensor:
    """``mhc.expand``: residual [T, n, D], y [T, D] (or a tuple of two [T, D] parts, summed in fp32 in the kernel),
    post [T, n], comb [T, n, n] -> [T, n, D] in residual.dtype. ``force_kernel``: CPU tensors in Triton's
    interpreter (tests only)."""
    if not (supports_expand(residual, y, post, comb) or force_kernel and 1 <= len(_parts(y)) <= 2):
        return hand_off("mhc.expand", f"operands {residual.dtype}/{[getattr(p, 'dtype', p) for p in _parts(y)]} on "
                        f"{residual.device} not covered", mhc_expand, residual, y, post, comb)
    parts = _parts(y)
    t, n, d = residual.shape
    if any(tuple(p.shape) != (t, d) for p in parts) or tuple(post.shape) != (t, n) or tuple(comb.shape) != (t, n, n):
        raise ValueError(f"mhc.expand: for residual {tuple(residual.shape)} expected y [{t}, {d}], post [{t}, {n}], "
                         f"comb [{t}, {n}, {n}]; got {[tuple(p.shape) for p in parts]}, {tuple(post.shape)}, "
                         f"{tuple(comb.shape)}")
    out = torch.empty(t, n, d, dtype=residual.dtype, device=residual.device)
    if t and d:
        bd = min(512, next_pow2(d))
        y1 = parts[0].contiguous()
        _expand_kernel[(t, triton.cdiv(d, bd))](residual.contiguous(), y1, parts[-1].contiguous(), post.contiguous(),
                                                comb.contiguous(), out, n, d, NP=max(2, next_pow2(n)), BLOCK_D=bd,
                                                TWO_PARTS=len(parts) == 2, num_warps=4, **pdl_launch())
    return out
