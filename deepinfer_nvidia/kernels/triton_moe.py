"""Routed experts on the checkpoint layout (MXFP4 or FP8 blocks) with in-kernel dequantisation.

``moe.experts_mxfp4``: one grouped pass over all routed experts, no host synchronisation
(so a step that contains it can be captured in a CUDA graph):

1. ``align`` (a few torch ops on the device, fixed shapes): the T*k (token, slot) pairs are
   sorted by expert (stable) and laid out in ``BLOCK_M``-row blocks, each block owned by
   one expert (an expert's last block padded with the sentinel pair ``P = T*k``). The
   number of blocks is bounded by ``P // BLOCK_M + min(E, P) + 1`` whatever the routing,
   so every buffer has a shape known on the host; blocks past the last used one carry the
   expert id ``E`` and exit at once.
2. ``_moe_up_kernel``: grid (blocks, F / BLOCK_N). Gathers the block's token rows, multiplies
   them with the expert's w1 and w3 tiles dequantised in registers (MXFP4 -> x.dtype),
   applies the clamped SwiGLU and writes ``h [blocks*BLOCK_M, F]``.
3. ``_moe_down_kernel``: grid (blocks, D / BLOCK_N). ``h @ dequant(w2[e])^T``, rounded to
   x.dtype like the reference's per-expert product, times the routing weight, written to
   its own row of ``y [P, D]`` (fp32; every pair has exactly one row, so no atomics).
4. ``sum_slices``: the k rows of each token summed in fp32 (slot order), cast to x.dtype (one launch).

Numerics follow the reference step by step (gate/up products rounded to x.dtype, clamp,
SiLU in fp32 rounded to x.dtype, product rounded to x.dtype, down product rounded to
x.dtype, fp32 weighting and sum); only summation orders differ (K tiles; the k slots of a
token are summed in slot order, the reference in expert order).

MXFP4 decoding: byte ``j`` of a row holds elements ``2j`` (low nibble) and ``2j+1`` (high
nibble). Instead of interleaving the two nibble planes, the activations are read as their
even and odd columns and each plane gets its own ``tl.dot``. A nibble ``c`` becomes the fp16
bit pattern ``(c & 7) << 9 | (c & 8) << 12`` (exponent and mantissa land in place; code 1
is the fp16 subnormal 2^-15), i.e. ``E2M1[c] * 2^-14`` exactly; the 2^14 is folded into the
group scale.

On SM90 with Gluon, bf16 activations and ``SWAP_MIN_PAIRS <= T*k <= SWAP_MAX_PAIRS`` (default 1..98304) go first
to the weight-stationary swap-AB ``wgmma`` kernels of ``gluon_moe_swap`` (H200, eleventh pass: 1.2-2.3x the
paths below at every measured size). The rest of this list is what other GPUs (and other dtypes) run.

Small batches (decode, ``T*k <= triton_moe_splitk.SPLITK_PAIRS``): split-K GEMV kernels, one program per
(routed pair, row tile, K split), same roundings (``triton_moe_splitk``'s docstring); the blocks above keep
one valid row in 16 at decode and each program streams a whole K panel (latency-bound). From
``triton_moe_segments.SEG_MIN_PAIRS`` pairs the weight decode is shared by up to ``SEG_R`` pairs of one
expert (``triton_moe_segments``).

Above the split-K range, bf16 activations take ``tl.dot_scaled`` tiles (``triton_moe_scaled``, from
``SCALED_PAIRS``: the compiler's e2m1 upcast or native block-scaled MMA instead of the hand decode; H200,
tenth pass: 1.25-1.65x the grouped kernels below, 1.16-1.53x dequant-once at 49152-98304 pairs). The grouped
kernels here serve other dtypes and the batch-invariant provider.

Very large batches (``T*k >= DEQUANT_PAIRS``, bf16): the in-kernel dequantisation is repeated for every
block of rows, so from some size it costs more than dequantising each expert once (extrapolated from the
tenth pass's measurements). That path sorts the pairs, dequantises ``DEQUANT_CHUNK`` experts at a time to bf16
(``_mxfp4_dequant_kernel``, one pass) and runs three CUTLASS grouped GEMMs per chunk
(``torch._grouped_mm``); it syncs once for the chunk boundaries and holds at most
``DEQUANT_CHUNK`` experts in bf16 (1.6 GB for 32 V4-Flash experts).

``moe.experts_fp8`` (the FP8-expert checkpoints, V4-Flash-Base) runs, with ``FP8_GROUPED`` (on; its H200
conformance test passed in the seventeenth pass), the same grouped layout with an FP8 tile decode
(``triton_moe_fp8``, no host sync, capturable) below ``FP8_LOOP_PAIRS`` pairs. Otherwise it keeps the
per-expert path: one host sync per call, three block-scaled GEMMs per routed expert.
V4-Flash and V4.1-Flash ship MXFP4 experts.

Batch-invariant variants (provider ``triton_bi``): the default picks ``BLOCK_M`` (and with it
BLOCK_N / warps from ``TUNE``) from the mean number of pairs per expert and switches to
dequant-once + ``torch._grouped_mm`` from ``DEQUANT_PAIRS``, so a pair's bits depend on the
batch. ``moe_experts_mxfp4_bi`` always runs the grouped Triton path with the fixed ``BI_TILES``:
a pair row gets the same K tiles and dot shapes in any block, the sorting only moves rows, and
the k slots of a token are summed in slot order. ``moe_experts_fp8_bi`` (with ``FP8_GROUPED``) runs
``triton_moe_fp8``'s grouped kernels with its fixed ``BI_TILES`` at every size, the same argument; without it,
the per-expert loop below. ``moe_experts_dense_bi`` runs the per-expert loop on the batch-invariant GEMMs
(``triton_gemm.*_bi``); a token's k expert outputs are added in expert-id order whatever else is routed.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_core.kernels.ops.moe import clamped_swiglu, experts_dense, experts_fp8, experts_mxfp4
from deepinfer_core.kernels.ops.mxfp4_words import expert_bytes, is_word_layout
from deepinfer_core.kernels.ops.quant import MXFP4_GROUP, QuantFormatError
from deepinfer_nvidia.kernels import gluon_moe_swap as _sw
from deepinfer_nvidia.kernels import triton_align as _align
from deepinfer_nvidia.kernels import triton_moe_fp8 as _fp8
from deepinfer_nvidia.kernels import triton_moe_scaled as _sc
from deepinfer_nvidia.kernels import triton_moe_segments as _seg
from deepinfer_nvidia.kernels import triton_moe_splitk as _splitk
from deepinfer_nvidia.kernels._common import dot_precision, hand_off, next_pow2, on_cuda
from deepinfer_nvidia.kernels.triton_moe_common import _expert_block, _swiglu
from deepinfer_nvidia.kernels.triton_gemm import _ue8m0, gemm_dense_bi, gemm_fp8_block, gemm_fp8_block_bi, sum_slices


def supports(x, weights, ids, *rest) -> bool:
    return on_cuda(x, weights, ids) and x.dtype in (torch.bfloat16, torch.float16, torch.float32) and x.dim() == 2


# -- routing layout ------------------------------------------------------------------------------
def block_m_for(pairs: int, experts: int) -> int:
    """Rows per block: the mean number of pairs per routed expert, rounded up to 16/32/64."""
    mean = pairs / max(1, min(experts, pairs))
    return 16 if mean <= 16 else 32 if mean <= 48 else 64


def num_blocks(pairs: int, experts: int, block_m: int) -> int:
    """Upper bound of sum_e ceil(count_e / block_m) over any routing of ``pairs`` pairs to ``experts``."""
    return pairs // block_m + min(experts, pairs) + 1


def align(ids: torch.Tensor, experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``ids [T, k]`` -> (``pair [NB*block_m]`` int32: pair index ``t*k + j`` or the sentinel ``T*k``,
    ``block_expert [NB]`` int32: owning expert, ``experts`` for unused blocks). Device ops only, no sync."""
    p = ids.numel()
    nb = num_blocks(p, experts, block_m)
    if ids.is_cuda and 0 < p <= _align.ALIGN_MAX_PAIRS:  # one launch instead of ~20 (reads ids as they are)
        return _align.align_small(ids, experts, block_m, nb)
    flat = ids.reshape(-1).long()
    dev = flat.device
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(experts, dtype=torch.long, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + (block_m - 1)) // block_m * block_m
    pend = torch.cumsum(padded, 0)
    se = flat[order]
    # destination row of the i-th sorted pair: its expert's first padded row + its rank among that expert's pairs
    dest = (pend - padded - (torch.cumsum(counts, 0) - counts))[se] + torch.arange(p, device=dev)
    pair = torch.full((nb * block_m,), p, dtype=torch.int32, device=dev)
    pair[dest] = order.to(torch.int32)
    block_expert = torch.searchsorted(pend, torch.arange(nb, device=dev) * block_m, right=True).to(torch.int32)
    return pair, block_expert


# -- kernels -------------------------------------------------------------------------------------
@triton.jit
def _e2m1_x2p14(c):
    """int32 nibble codes (0..15) -> fp32 ``E2M1[c] * 2^-14`` (exact, via the fp16 bit pattern)."""
    h = ((c & 7) << 9) | ((c & 8) << 12)
    return h.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _e2m1_bf16(c, base):
    """int32 nibble codes -> bf16 ``E2M1[c] * 2^(s-127)`` built as bits (no float conversion):
    ``base = (s - 1) << 7``; code 1 is ``0.5 * 2^(s-127)``, codes 2..7 put exponent and mantissa in place."""
    t = c & 7
    bits = tl.where(t >= 2, (t << 6) + base, tl.where(t == 1, base, 0)) | ((c & 8) << 12)
    return bits.to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _mxfp4_planes(w_ptr, s_ptr, rn, nmask, k0, K, dtype: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, INT_DECODE: tl.constexpr = False):
    """Weight rows ``rn`` of an MXFP4 matrix [N, K/2] (+ scales [N, K/32]), K elements k0..k0+BLOCK_K:
    returns (even columns, odd columns), each [BLOCK_N, BLOCK_K/2] in ``dtype``.

    ``INT_DECODE``: build the bf16 bits with integer ops only (exact for scale bytes >= 2, i.e. scales
    >= 2^-125; smaller scales decode to values below 2^-125, not to the exact subnormals), else decode
    through fp16 bits and an fp32 multiply (exact)."""
    HALF: tl.constexpr = BLOCK_K // 2
    GROUPS: tl.constexpr = BLOCK_K // 32
    rj = k0 // 2 + tl.arange(0, HALF)
    byte = tl.load(w_ptr + rn[:, None].to(tl.int64) * (K // 2) + rj[None, :],
                   mask=nmask[:, None] & (rj[None, :] < K // 2), other=0).to(tl.int32)
    rg = k0 // 32 + tl.arange(0, GROUPS)
    sb = tl.load(s_ptr + rn[:, None].to(tl.int64) * (K // 32) + rg[None, :],
                 mask=nmask[:, None] & (rg[None, :] < K // 32), other=127).to(tl.int32)
    if INT_DECODE:
        base = tl.maximum(sb - 1, 0) << 7
        base = tl.reshape(tl.broadcast_to(base[:, :, None], [BLOCK_N, GROUPS, 16]), [BLOCK_N, HALF])
        lo = _e2m1_bf16(byte & 15, base).to(dtype)
        hi = _e2m1_bf16(byte >> 4, base).to(dtype)
    else:
        sc = _ue8m0(sb) * 16384.0  # [BN, GROUPS]; 2^14 undoes the decoder's 2^-14
        sc = tl.reshape(tl.broadcast_to(sc[:, :, None], [BLOCK_N, GROUPS, 16]), [BLOCK_N, HALF])
        lo = (_e2m1_x2p14(byte & 15) * sc).to(dtype)
        hi = (_e2m1_x2p14(byte >> 4) * sc).to(dtype)
    return lo, hi


@triton.jit
def _moe_up_kernel(x_ptr, pair_ptr, bexp_ptr, w1_ptr, s1_ptr, w3_ptr, s3_ptr, h_ptr, P, E, D, F, stride_x, limit,
                   TOPK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   PREC: tl.constexpr, INT_DECODE: tl.constexpr):
    pid_b = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(bexp_ptr + pid_b)
    if e >= E:
        return
    rows, pair, valid, rn, nmask = _expert_block(pair_ptr, pid_b, pid_n, P, F, BLOCK_M, BLOCK_N)
    tok = (pair // TOPK).to(tl.int64)
    dtype = x_ptr.dtype.element_ty
    e64 = e.to(tl.int64)
    w1 = w1_ptr + e64 * F * (D // 2)
    w3 = w3_ptr + e64 * F * (D // 2)
    s1 = s1_ptr + e64 * F * (D // 32)
    s3 = s3_ptr + e64 * F * (D // 32)
    HALF: tl.constexpr = BLOCK_K // 2
    acc1 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, D, BLOCK_K):
        rk = k0 + 2 * tl.arange(0, HALF)
        xm = valid[:, None] & (rk[None, :] < D)
        xrow = x_ptr + tok[:, None] * stride_x + rk[None, :]
        xe = tl.load(xrow, mask=xm, other=0.0)
        xo = tl.load(xrow + 1, mask=xm, other=0.0)
        lo, hi = _mxfp4_planes(w1, s1, rn, nmask, k0, D, dtype, BLOCK_N, BLOCK_K, INT_DECODE)
        acc1 += tl.dot(xe, tl.trans(lo), input_precision=PREC)
        acc1 += tl.dot(xo, tl.trans(hi), input_precision=PREC)
        lo, hi = _mxfp4_planes(w3, s3, rn, nmask, k0, D, dtype, BLOCK_N, BLOCK_K, INT_DECODE)
        acc3 += tl.dot(xe, tl.trans(lo), input_precision=PREC)
        acc3 += tl.dot(xo, tl.trans(hi), input_precision=PREC)
    h = _swiglu(acc1, acc3, limit, dtype)  # the reference's clamped SwiGLU and roundings
    tl.store(h_ptr + rows[:, None].to(tl.int64) * F + rn[None, :], h, mask=nmask[None, :])


@triton.jit
def _moe_down_kernel(h_ptr, pair_ptr, bexp_ptr, wt_ptr, w2_ptr, s2_ptr, y_ptr, P, E, D, F,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PREC: tl.constexpr,
                     INT_DECODE: tl.constexpr):
    pid_b = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(bexp_ptr + pid_b)
    if e >= E:
        return
    rows, pair, valid, rn, nmask = _expert_block(pair_ptr, pid_b, pid_n, P, D, BLOCK_M, BLOCK_N)
    dtype = h_ptr.dtype.element_ty
    e64 = e.to(tl.int64)
    w2 = w2_ptr + e64 * D * (F // 2)
    s2 = s2_ptr + e64 * D * (F // 32)
    HALF: tl.constexpr = BLOCK_K // 2
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, F, BLOCK_K):
        rk = k0 + 2 * tl.arange(0, HALF)
        hm = rk[None, :] < F
        hrow = h_ptr + rows[:, None].to(tl.int64) * F + rk[None, :]
        he = tl.load(hrow, mask=hm, other=0.0)
        ho = tl.load(hrow + 1, mask=hm, other=0.0)
        lo, hi = _mxfp4_planes(w2, s2, rn, nmask, k0, F, dtype, BLOCK_N, BLOCK_K, INT_DECODE)
        acc += tl.dot(he, tl.trans(lo), input_precision=PREC)
        acc += tl.dot(ho, tl.trans(hi), input_precision=PREC)
    wt = tl.load(wt_ptr + pair, mask=valid, other=0.0)
    y = acc.to(dtype).to(tl.float32) * wt[:, None]
    tl.store(y_ptr + pair[:, None].to(tl.int64) * D + rn[None, :], y, mask=valid[:, None] & nmask[None, :])


# (block_n, num_warps, num_stages, int_decode) per BLOCK_M of the grouped kernels (benchmarks can override).
# H200, bench_moe (docs/performance.md): BLOCK_N 64 / 4 warps at BLOCK_M 16, 128 / 8 warps above.
TUNE: dict[int, tuple[int, int, int, int]] = {16: (64, 4, 3, 0), 32: (128, 8, 3, 0), 64: (128, 8, 3, 0)}
# int_decode for the prefill path's dequantiser
DEQUANT_INT = 0
# Pairs (tokens x top-k) from which bf16 activations take the dequantise-once + grouped-GEMM path;
# 0 disables it. Chosen from the H200 measurements in docs/performance.md.
# Tenth pass: the tl.dot_scaled path (triton_moe_scaled) won up to 98304 pairs (1.16x there, 1.53x at 49152);
# the crossover is extrapolated from those two points (~130k pairs), not measured.
DEQUANT_PAIRS = 131072
DEQUANT_CHUNK = 32


@triton.jit
def _mxfp4_dequant_kernel(w_ptr, s_ptr, out_ptr, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          INT_DECODE: tl.constexpr):
    """Stacked MXFP4 [C, N, K/2] (+ scales [C, N, K/32]) -> out [C, N, K] in out's dtype; grid (C, N/BN, K/BK)."""
    c = tl.program_id(0).to(tl.int64)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    k0 = tl.program_id(2) * BLOCK_K
    nmask = rn < N
    dtype = out_ptr.dtype.element_ty
    lo, hi = _mxfp4_planes(w_ptr + c * N * (K // 2), s_ptr + c * N * (K // 32), rn, nmask, k0, K, dtype, BLOCK_N,
                           BLOCK_K, INT_DECODE)
    w = tl.reshape(tl.join(lo, hi), [BLOCK_N, BLOCK_K])  # element 2j, then 2j+1
    rk = k0 + tl.arange(0, BLOCK_K)
    tl.store(out_ptr + c * N * K + rn[:, None].to(tl.int64) * K + rk[None, :], w,
             mask=nmask[:, None] & (rk[None, :] < K))


def dequant_mxfp4_stack(w: torch.Tensor, s: torch.Tensor, dtype: torch.dtype, int_decode: int | None = None
                        ) -> torch.Tensor:
    """[C, N, K/2] packed + [C, N, K/32] UE8M0 -> [C, N, K] in ``dtype`` (one pass)."""
    c, n, half = w.shape
    k = 2 * half
    out = torch.empty(c, n, k, dtype=dtype, device=w.device)
    if out.numel():
        bk = max(32, min(256, next_pow2(k)))
        _mxfp4_dequant_kernel[(c, triton.cdiv(n, 32), triton.cdiv(k, bk))](
            w.view(torch.uint8).contiguous(), s.view(torch.uint8).contiguous(), out, n, k, BLOCK_N=32, BLOCK_K=bk,
            INT_DECODE=bool(DEQUANT_INT if int_decode is None else int_decode), num_warps=4)
    return out


def dequant_once_mxfp4(x, weights, ids, w1, s1, w3, s3, w2, s2, limit, chunk: int | None = None) -> torch.Tensor:
    """Prefill path: experts dequantised to bf16 ``chunk`` at a time, CUTLASS grouped GEMMs (one host sync). The
    weight stacks may be in core's word layout: each chunk is unpacked as it is dequantised (never a whole stack)."""
    t, d = x.shape
    k = ids.shape[1]
    ne = w1.shape[0]
    chunk = chunk or DEQUANT_CHUNK
    flat = ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(ne, dtype=torch.long, device=x.device).scatter_add_(0, flat, torch.ones_like(flat))
    ends = torch.cumsum(counts, 0)
    xs = x.index_select(0, order // k)  # [P, D] grouped by expert
    ws = weights.reshape(-1).float()[order]
    ysorted = torch.empty(t * k, d, dtype=torch.float32, device=x.device)
    starts = [0] + ends[chunk - 1::chunk].tolist()  # the one host sync: chunk boundaries
    for i, c0 in enumerate(range(0, ne, chunk)):
        a, b = starts[i], starts[i + 1] if i + 1 < len(starts) else t * k
        if a == b:
            continue
        c1 = min(c0 + chunk, ne)
        offs = (ends[c0:c1] - a).to(torch.int32)
        d1 = dequant_mxfp4_stack(expert_bytes(w1[c0:c1]), s1[c0:c1], x.dtype)
        d3 = dequant_mxfp4_stack(expert_bytes(w3[c0:c1]), s3[c0:c1], x.dtype)
        h = clamped_swiglu(torch._grouped_mm(xs[a:b], d1.transpose(1, 2), offs=offs),
                           torch._grouped_mm(xs[a:b], d3.transpose(1, 2), offs=offs), limit)
        del d1, d3
        d2 = dequant_mxfp4_stack(expert_bytes(w2[c0:c1]), s2[c0:c1], x.dtype)
        ysorted[a:b] = torch._grouped_mm(h, d2.transpose(1, 2), offs=offs).float() * ws[a:b, None]
        del d2, h
    y = torch.empty_like(ysorted)
    y[order] = ysorted
    return sum_slices(y, t, d, k, d, k * d, x.dtype)


def _dequant_once_ok(x: torch.Tensor, pairs: int) -> bool:
    from deepinfer_nvidia.kernels.aten_ops import _grouped_mm_available

    return (DEQUANT_PAIRS > 0 and pairs >= DEQUANT_PAIRS and x.dtype == torch.bfloat16 and x.shape[1] % 8 == 0
            and _grouped_mm_available())


def swap_takes(x: torch.Tensor, pairs: int, w1: torch.Tensor) -> bool:
    """Whether ``moe_experts_mxfp4`` serves ``pairs`` routed pairs of x [T, D] (D, and F of w1 [E, F, *], multiples
    of 32) with the Gluon swap kernels (SM90, bf16; after dequant-once's range, within ``SWAP_MIN/MAX_PAIRS``)."""
    return (bool(_sw.SWAP_MAX_PAIRS) and _sw.SWAP_MIN_PAIRS <= pairs <= _sw.SWAP_MAX_PAIRS and _sw.supports_swap(x)
            and not _dequant_once_ok(x, pairs) and x.shape[1] % 32 == 0 and w1.shape[1] % 32 == 0)


# -- wrappers ------------------------------------------------------------------------------------
def _check_mxfp4_stack(name: str, w: torch.Tensor, s: torch.Tensor, e: int, n: int, k: int) -> None:
    if tuple(w.shape) != (e, n, k // 2) or tuple(s.shape) != (e, n, k // MXFP4_GROUP):
        raise QuantFormatError(f"moe.experts_mxfp4: {name} must be [{e}, {n}, {k // 2}] packed with scales "
                               f"[{e}, {n}, {k // MXFP4_GROUP}], got {list(w.shape)} and {list(s.shape)}")


def _word_layout(w1, w3, w2) -> bool:
    """Whether the weight stacks are in core's word layout (int32 words; all three or none)."""
    kinds = {is_word_layout(w) for w in (w1, w3, w2)}
    if len(kinds) > 1:
        raise QuantFormatError("moe.experts_mxfp4: w1, w3 and w2 must share one layout (checkpoint uint8 bytes or "
                               f"int32 words), got {w1.dtype}, {w3.dtype}, {w2.dtype}")
    return kinds.pop()


def _check_stacks(x, w1, s1, w3, s3, w2, s2) -> None:
    d, ne, f = x.shape[1], w1.shape[0], w1.shape[1]
    if d % MXFP4_GROUP or f % MXFP4_GROUP:
        raise QuantFormatError(f"moe.experts_mxfp4: D={d} and F={f} must be multiples of {MXFP4_GROUP}")
    _check_mxfp4_stack("w1", w1, s1, ne, f, d)
    _check_mxfp4_stack("w3", w3, s3, ne, f, d)
    _check_mxfp4_stack("w2", w2, s2, ne, d, f)


def grouped_mxfp4(x, weights, ids, w1, s1, w3, s3, w2, s2, limit, block_m: int | None = None,
                  block_n: int | None = None, warps: int | None = None, stages: int | None = None,
                  int_decode: int | None = None) -> torch.Tensor:
    """The grouped path (no host sync). ``block_m``/``block_n``/``warps``/``stages``: tuning knobs
    (defaults: ``block_m_for`` and ``TUNE``)."""
    t, d = x.shape
    k = ids.shape[1]
    ne, f = w1.shape[0], w1.shape[1]
    _check_stacks(x, w1, s1, w3, s3, w2, s2)
    if t == 0 or k == 0:
        return torch.zeros(t, d, dtype=x.dtype, device=x.device)
    x = x if x.stride(1) == 1 else x.contiguous()
    p = t * k
    bm = block_m or block_m_for(p, ne)
    tn, tw, ts, ti = (tuple(TUNE.get(bm, (64, 4, 3, 0))) + (0,))[:4]
    block_n, warps, stages = block_n or tn, warps or tw, stages or ts
    idec = bool(ti if int_decode is None else int_decode)
    pair, bexp = align(ids, ne, bm)
    nb = bexp.numel()
    u8 = [a.view(torch.uint8).contiguous() for a in (w1, s1, w3, s3, w2, s2)]
    prec = dot_precision(x.dtype)
    h = torch.empty(nb * bm, f, dtype=x.dtype, device=x.device)
    bk1 = max(32, min(128, next_pow2(d)))
    _moe_up_kernel[(nb, triton.cdiv(f, block_n))](x, pair, bexp, u8[0], u8[1], u8[2], u8[3], h, p, ne, d, f,
                                                  x.stride(0), float(limit), TOPK=k, BLOCK_M=bm, BLOCK_N=block_n,
                                                  BLOCK_K=bk1, PREC=prec, INT_DECODE=idec, num_warps=warps,
                                                  num_stages=stages)
    y = torch.empty(p, d, dtype=torch.float32, device=x.device)
    bk2 = max(32, min(128, next_pow2(f)))
    wt = weights.reshape(-1).float().contiguous()
    _moe_down_kernel[(nb, triton.cdiv(d, block_n))](h, pair, bexp, wt, u8[4], u8[5], y, p, ne, d, f, BLOCK_M=bm,
                                                    BLOCK_N=block_n, BLOCK_K=bk2, PREC=prec, INT_DECODE=idec,
                                                    num_warps=warps, num_stages=stages)
    return sum_slices(y, t, d, k, d, k * d, x.dtype)  # the k slots of each token, in slot order


def moe_experts_mxfp4(x, weights, ids, w1, s1, w3, s3, w2, s2, limit):
    """x [T, D]; w1, w3 [E, F, D/2] uint8 + UE8M0 [E, F, D/32]; w2 [E, D, F/2] + [E, D, F/32]. The weight stacks
    may instead be ``int32 [E, N, K/8]`` in core's word layout (``mxfp4_layout``): the swap kernels decode it as it
    is, the other paths read the stacks unpacked to checkpoint bytes."""
    if not supports(x, weights, ids):
        return hand_off("moe.experts_mxfp4", f"operands x {x.dtype} on {x.device} not covered",
                        experts_mxfp4, x, weights, ids, w1, s1, w3, s3, w2, s2, limit)
    packed = _word_layout(w1, w3, w2)
    b1, b3, b2 = (w.view(torch.uint8) for w in (w1, w3, w2))  # either layout's bytes as [E, N, K/2]
    rows = x.dim() == 2 and ids.dim() == 2
    if rows and _dequant_once_ok(x, ids.numel()):
        _check_stacks(x, b1, s1, b3, s3, b2, s2)
        return dequant_once_mxfp4(x, weights, ids, w1, s1, w3, s3, w2, s2, limit)  # unpacks a chunk at a time
    if rows and swap_takes(x, ids.numel(), w1):  # SM90: weight-stationary wgmma
        _check_stacks(x, b1, s1, b3, s3, b2, s2)
        out = _sw.swap_or_none(x, weights, ids, b1, s1, b3, s3, b2, s2, limit, packed=packed)
        if out is not None:
            return out
    if packed:
        # the other paths read checkpoint bytes: a transient unpacked copy (on SM90 only where the Gluon kernels
        # fail to compile, since the layout is made only where they run)
        w1, w3, w2 = (expert_bytes(w) for w in (w1, w3, w2))
    if x.dim() == 2 and ids.dim() == 2 and 0 < ids.numel() <= _splitk.SPLITK_PAIRS:
        _check_stacks(x, w1, s1, w3, s3, w2, s2)
        xc = x if x.stride(1) == 1 else x.contiguous()
        if _seg.SEG_R > 1 and ids.numel() >= _seg.SEG_MIN_PAIRS:  # one weight decode for up to SEG_R pairs
            return _seg.segments_mxfp4(xc, weights, ids, w1, s1, w3, s3, w2, s2, limit, pairs_per_program=_seg.SEG_R)
        return _splitk.splitk_mxfp4(xc, weights, ids, w1, s1, w3, s3, w2, s2, limit)
    if x.dim() == 2 and ids.dim() == 2 and _sc.SCALED_PAIRS and ids.numel() >= _sc.SCALED_PAIRS and \
            _sc.supports_scaled(x):
        _check_stacks(x, w1, s1, w3, s3, w2, s2)
        return _sc.scaled_mxfp4(x, weights, ids, w1, s1, w3, s3, w2, s2, limit)
    return grouped_mxfp4(x, weights, ids, w1, s1, w3, s3, w2, s2, limit)


# -- FP8 experts: grouped (no sync) below FP8_LOOP_PAIRS, else a per-expert loop (one host sync) --------
# Pairs (tokens x top-k) from which FP8 experts take the per-expert loop. H200, V4 slice of 2 layers, FP8
# experts (pass17c): the grouped kernels beat the loop 8.3x at a 1024-token prefill (25.3 against 211 ms a
# step) and 9.4x at 4096 tokens (30.9 against 290 ms, 24576 pairs); so the loop is kept only past 131072
# pairs (21845 tokens at k=6; dequant-once's threshold for MXFP4 experts), where the grouped path's
# intermediates [pairs, F] bf16 and [pairs, D] fp32 would pass 2 GB.
FP8_LOOP_PAIRS = 1 << 17
# The grouped FP8 kernels (``triton_moe_fp8``) for ``moe.experts_fp8`` (both providers). On since their H200
# conformance test (``test_conformance_moe_fp8.py``, 76 cases) and the engine's graphs-vs-eager check passed
# (seventeenth pass): V4 FP8-expert decode at batch 1 graphed 1.55 ms against 9.06 ms eager with the loop.
FP8_GROUPED = True


def _run(x, weights, ids, limit, gemm3):
    t, d = x.shape
    k = ids.shape[1]
    out = torch.zeros(t, d, dtype=torch.float32, device=x.device)
    if t == 0 or k == 0:
        return out.to(x.dtype)
    flat = ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    experts, counts = torch.unique_consecutive(flat[order], return_counts=True)
    tok_all = order // k
    w_all = weights.reshape(-1).float()[order]
    start = 0
    for e, n in zip(experts.tolist(), counts.tolist()):  # one host sync above, none in the loop
        tok = tok_all[start:start + n]
        xe = x.index_select(0, tok)
        g1, g3, g2 = gemm3(e)
        h = clamped_swiglu(g1(xe), g3(xe), limit)
        y = g2(h).float() * w_all[start:start + n, None]
        out.index_add_(0, tok, y)
        start += n
    return out.to(x.dtype)


def moe_experts_fp8(x, weights, ids, w1, s1, w3, s3, w2, s2, block, limit):
    """x [T, D]; w1, w3 [E, F, D] e4m3 + block scales [E, F/bn, D/bk]; w2 [E, D, F] + [E, D/bn, F/bk]."""
    if not supports(x, weights, ids):
        return hand_off("moe.experts_fp8", f"operands x {x.dtype} on {x.device} not covered",
                        experts_fp8, x, weights, ids, w1, s1, w3, s3, w2, s2, block, limit)

    if FP8_GROUPED and ids.dim() == 2 and ids.numel() < FP8_LOOP_PAIRS and _fp8.takes(x, w1, block):
        return _fp8.grouped_fp8(x, weights, ids, w1, s1, w3, s3, w2, s2, block, limit)

    def gemm3(e):
        return (lambda a: gemm_fp8_block(a, w1[e], s1[e], block), lambda a: gemm_fp8_block(a, w3[e], s3[e], block),
                lambda a: gemm_fp8_block(a, w2[e], s2[e], block))

    return _run(x, weights, ids, limit, gemm3)


# -- batch-invariant variants (provider ``triton_bi``) ----------------------------------------------
# (block_m, block_n, warps, stages, int_decode) of the grouped kernels for every batch: BLOCK_M 16 is
# what decode picks anyway (a few pairs per expert up to batch ~64); pinned here rather than read from
# TUNE, which benchmarks may rewrite.
BI_TILES = (16, 64, 4, 3, 0)


def moe_experts_mxfp4_bi(x, weights, ids, w1, s1, w3, s3, w2, s2, limit):
    """``moe.experts_mxfp4``, batch-invariant: x [T, D] -> [T, D] in x.dtype; always the grouped
    Triton path with ``BI_TILES`` (never dequant-once + grouped_mm)."""
    if not supports(x, weights, ids):
        return hand_off("moe.experts_mxfp4[bi]", f"operands x {x.dtype} on {x.device} not covered",
                        experts_mxfp4, x, weights, ids, w1, s1, w3, s3, w2, s2, limit)
    bm, bn, warps, stages, idec = BI_TILES
    w1, w3, w2 = (expert_bytes(w) for w in (w1, w3, w2))  # word-layout stacks (not made in this mode) unpacked
    return grouped_mxfp4(x, weights, ids, w1, s1, w3, s3, w2, s2, limit, block_m=bm, block_n=bn, warps=warps,
                         stages=stages, int_decode=idec)


def moe_experts_fp8_bi(x, weights, ids, w1, s1, w3, s3, w2, s2, block, limit):
    """``moe.experts_fp8``, batch-invariant: with ``FP8_GROUPED``, ``triton_moe_fp8``'s grouped kernels with the
    fixed ``BI_TILES`` (no host sync); else, and for operands they do not take, a per-expert loop over
    ``gemm_fp8_block_bi`` (one sync)."""
    if not supports(x, weights, ids):
        return hand_off("moe.experts_fp8[bi]", f"operands x {x.dtype} on {x.device} not covered",
                        experts_fp8, x, weights, ids, w1, s1, w3, s3, w2, s2, block, limit)
    if FP8_GROUPED and ids.dim() == 2 and _fp8.takes(x, w1, block):
        bm, bn, warps, stages, max_k = _fp8.BI_TILES
        return _fp8.grouped_fp8(x, weights, ids, w1, s1, w3, s3, w2, s2, block, limit, block_m=bm, block_n=bn,
                                warps=warps, stages=stages, max_k=max_k)

    def gemm3(e):
        return (lambda a: gemm_fp8_block_bi(a, w1[e], s1[e], block),
                lambda a: gemm_fp8_block_bi(a, w3[e], s3[e], block),
                lambda a: gemm_fp8_block_bi(a, w2[e], s2[e], block))

    return _run(x, weights, ids, limit, gemm3)


def moe_experts_dense_bi(x, weights, ids, w1, w3, w2, limit):
    """``moe.experts`` (dense w1, w3 [E, F, D], w2 [E, D, F]), batch-invariant: per-expert loop over
    ``gemm_dense_bi`` (one host sync)."""
    if not supports(x, weights, ids):
        return hand_off("moe.experts[bi]", f"operands x {x.dtype} on {x.device} not covered",
                        experts_dense, x, weights, ids, w1, w3, w2, limit)

    def gemm3(e):
        return (lambda a: gemm_dense_bi(a, w1[e]), lambda a: gemm_dense_bi(a, w3[e]),
                lambda a: gemm_dense_bi(a, w2[e]))

    return _run(x, weights, ids, limit, gemm3)
