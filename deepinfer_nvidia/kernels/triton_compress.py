"""Triton KV compressor pooling (``compress.softmax_pool``): the CSA / HCA window pool in one launch; and
``compress.ring_pair_pool``, a V4.1 ratio-2 compressor's decode step (partner from the ring, pool, ring write), in
one launch (at the end of this file).

``out[n, c] = sum_s softmax_s(score[n, :, c]) * kv[n, s, c]`` over the S slots of a window (S = 2 / 4 for the
V4.1 ratio-2 / ratio-4 windows, 2*ratio for the overlapping CSA windows, 128 for HCA). The reference
(``deepinfer_core/kernels/ops/compress.py``) materialises an fp64 copy of the scores, the softmax, a zeroed kv
copy and the product: ~6 passes over [N, S, d]. Here one program per (entry, channel tile) reads the scores
twice (pass 1: running max and normaliser; pass 2: weights; the second read of a tile hits the cache) and kv
once, and writes the [N, d] result once.

Precision: the softmax is fp32 (the reference's is fp64 rounded to fp32: ~1e-6 relative apart). As in the
reference, each weight is rounded to kv.dtype and each product ``w * kv`` to kv.dtype; the S products are
summed in fp32 and rounded once (torch sums bf16 in fp32 too), so bf16 results sit within a bf16 ulp or two.

Absent slots (score ``-inf``) contribute exactly zero whatever kv holds there: kv is not even loaded for them,
and their products are dropped with ``tl.where`` (multiplying by a zero weight would turn a NaN into NaN). A
channel whose S slots are all absent is 0/0 = NaN, as in the reference; callers never pool an empty window.

Batch-invariant: tiles come from (S, d) only, never N, and each output element is one program's fixed-order
sum. No host synchronisation (capturable). Covered: CUDA kv [N, S, d] fp32/bf16/fp16 with a float score of
the same shape, channel stride 1 after ``contiguous`` where needed; the rest goes to the reference, which also
raises its own errors. ``force_kernel=True`` skips the device check only (the interpreter tests).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_core.kernels.ops.compress import check_ring_pair_pool, softmax_pool as ref_pool
from deepinfer_core.kernels.ops.compress import ring_pair_pool as ref_ring_pair_pool
from deepinfer_nvidia.kernels._common import FLOATS, hand_off, next_pow2, on_cuda

# Tiles of up to 64 slots x 64 channels, 2 warps: measured on an H200 (bf16 kv, CUDA-graph timing) within 10%
# of the best of six shapes for every V4.1 window (S = 2, 4, 8: N = 2048..4096, d = 512; S = 128); whole
# 512-wide rows with 4 warps were 2.5x slower at S = 2 and 4 (cross-warp reductions over S).
_BLOCK_D = 64
_MAX_BLOCK_S = 64


@triton.jit
def _stats_step(x, m, l):
    """Pass 1 over one [slots, channels] tile of fp32 scores ``x``: the per-channel running max ``m`` and normaliser
    ``l = sum_s exp(score - m)`` updated (returned as (m, l))."""
    m_new = tl.maximum(m, tl.max(x, axis=0))
    # while a channel has seen only absent slots m_new is -inf: subtract 0 instead, as -inf - -inf is NaN
    # (exp(-inf - 0) = 0 then, so absent slots and the empty past both add exactly nothing)
    m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
    return m_new, l * tl.exp(m - m_sub) + tl.sum(tl.exp(x - m_sub[None, :]), axis=0)


@triton.jit
def _weighted_step(x, v, present, m_sub, l_div):
    """Pass 2 over one tile: w = exp(score - m) / l rounded to v's dtype, products rounded to it, the ``present``
    slots' products summed in fp32 (returned per channel)."""
    w = tl.math.div_rn(tl.exp(x - m_sub[None, :]), tl.zeros_like(x) + l_div[None, :])
    prod = (w.to(v.dtype).to(tl.float32) * v.to(tl.float32)).to(v.dtype).to(tl.float32)
    return tl.sum(tl.where(present, prod, 0.0), axis=0)


@triton.jit
def _pool_kernel(kv_ptr, sc_ptr, out_ptr, S, D, kv_sn, kv_ss, sc_sn, sc_ss,
                 BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    cm = c < D
    r = tl.arange(0, BLOCK_S)
    kv_row = kv_ptr + n * kv_sn + c[None, :]
    sc_row = sc_ptr + n * sc_sn + c[None, :]
    # pass 1: per-channel running max m and normaliser l = sum_s exp(score - m)
    m = tl.full([BLOCK_D], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_D], dtype=tl.float32)
    for s0 in range(0, S, BLOCK_S):
        s = s0 + r
        msk = (s < S)[:, None] & cm[None, :]
        x = tl.load(sc_row + s[:, None].to(tl.int64) * sc_ss, mask=msk, other=float("-inf")).to(tl.float32)
        m, l = _stats_step(x, m, l)
    # pass 2: w = exp(score - m) / l rounded to kv.dtype, products rounded to kv.dtype, fp32 sum
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    m_sub = tl.where(m == float("-inf"), 0.0, m)
    l_div = tl.where(l > 0.0, l, 1.0)  # all absent (or a padded channel): no 0/0 here, see the end
    for s0 in range(0, S, BLOCK_S):
        s = s0 + r
        msk = (s < S)[:, None] & cm[None, :]
        x = tl.load(sc_row + s[:, None].to(tl.int64) * sc_ss, mask=msk, other=float("-inf")).to(tl.float32)
        present = msk & (x != float("-inf"))
        v = tl.load(kv_row + s[:, None].to(tl.int64) * kv_ss, mask=present, other=0.0)
        acc += _weighted_step(x, v, present, m_sub, l_div)
    # every slot absent: the reference's softmax is 0/0 = NaN, and so is this
    out = tl.where(l > 0.0, acc, float("nan"))
    tl.store(out_ptr + n * D + c, out.to(out_ptr.dtype.element_ty), mask=cm)


def _uncovered(kv, score, force: bool) -> str | None:
    if not (force or on_cuda(kv, score)):
        return "operands not on a CUDA device"
    if not (isinstance(kv, torch.Tensor) and isinstance(score, torch.Tensor) and kv.dim() == 3
            and score.shape == kv.shape and kv.dtype in FLOATS and score.dtype in FLOATS and kv.shape[1] > 0):
        return "kv / score shapes or dtypes not covered"
    return None


def supports_pool(kv: torch.Tensor, score: torch.Tensor) -> bool:
    """CUDA kv [N, S >= 1, d] fp32/bf16/fp16 with a float score of the same shape."""
    return _uncovered(kv, score, False) is None


def softmax_pool(kv: torch.Tensor, score: torch.Tensor, *, force_kernel: bool = False) -> torch.Tensor:
    """``compress.softmax_pool``: kv [N, S, d], score [N, S, d] (-inf = absent) -> [N, d] in kv.dtype."""
    why = _uncovered(kv, score, force_kernel)
    if why:
        return hand_off("compress.softmax_pool", why, ref_pool, kv, score)
    n, s, d = kv.shape
    out = torch.empty(n, d, dtype=kv.dtype, device=kv.device)
    if n == 0 or d == 0:
        return out
    kv = kv if kv.stride(2) == 1 else kv.contiguous()
    score = score if score.stride(2) == 1 else score.contiguous()
    block_s = min(next_pow2(s), _MAX_BLOCK_S)
    block_d = min(next_pow2(d), _BLOCK_D)
    grid = (n, triton.cdiv(d, block_d))
    _pool_kernel[grid](kv, score, out, s, d, kv.stride(0), kv.stride(1), score.stride(0), score.stride(1),
                       BLOCK_S=block_s, BLOCK_D=block_d, num_warps=2)
    return out


# -- compress.ring_pair_pool: a ratio-2 compressor's decode step in one launch ------------------------------------
# Why (docs/performance_pass_44.md): composed, the step is ~10 launches (the closing mask, the partner's ring
# index and gather, the pair's stack, the pool, the ring row's index and write), and at the ratio-2 kv source they
# run beside the layer's largest GEMV on a side stream, where pass44b (H100) timed them at ~30 us together.


@triton.jit
def _ring_pair_kernel(both_ptr, ring_ptr, slot_ptr, pos_ptr, u_ptr, closes_ptr, S, D, CAP,
                      BLOCK_D: tl.constexpr):
    """Program (row t, channel tile): the pool of (ring[slot, (p - 1) % CAP], both[t]) over this tile's kv and z
    channels, then both[t]'s tile into ring[slot, p % CAP]. The pool is ``_pool_kernel``'s two passes (the same
    steps) over one tile of the two slots, so the bits are that kernel's on the stacked pair."""
    t = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    cm = c < D
    p = tl.load(pos_ptr + t).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    slot_c = slot + tl.zeros([BLOCK_D], dtype=tl.int64)  # as a tile: masks from it broadcast as tensors
    ok = cm & (slot_c >= 0) & (slot_c < S)  # the contract's slots; any other is neither read nor written (u NaN)
    prev = (p + CAP - 1) % CAP  # (p - 1) % CAP for p >= 0
    base = ring_ptr + slot * CAP * 2 * D
    r = tl.arange(0, 2)
    # slot 0 of the pair: the partner's row in the ring; slot 1: the token's own row
    row = tl.where(r[:, None] == 0, base + prev * 2 * D, both_ptr + t * 2 * D)  # [2, 1] row starts
    msk = ok[None, :] & (r[:, None] < 2)
    x = tl.load(row + D + c[None, :], mask=msk, other=float("-inf")).to(tl.float32)  # z
    m, l = _stats_step(x, tl.full([BLOCK_D], float("-inf"), tl.float32), tl.zeros([BLOCK_D], dtype=tl.float32))
    m_sub = tl.where(m == float("-inf"), 0.0, m)
    present = msk & (x != float("-inf"))
    v = tl.load(row + c[None, :], mask=present, other=0.0)  # kv
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)  # 0 + sum, as ``_pool_kernel`` adds its one tile: -0.0 becomes +0.0
    acc += _weighted_step(x, v, present, m_sub, tl.where(l > 0.0, l, 1.0))
    out = tl.where(l > 0.0, acc, float("nan"))
    tl.store(u_ptr + t * D + c, out.to(u_ptr.dtype.element_ty), mask=cm)
    # the token's row into the ring, after this program's read of the partner (another ring row: CAP >= 2)
    dest = base + (p % CAP) * 2 * D
    own = both_ptr + t * 2 * D
    tl.store(dest + c, tl.load(own + c, mask=cm), mask=ok)
    tl.store(dest + D + c, tl.load(own + D + c, mask=cm), mask=ok)
    if tl.program_id(1) == 0:
        tl.store(closes_ptr + t, (p % 2) == 1)


def _ring_uncovered(both, ring, slot, pos, force: bool) -> str | None:
    if not (force or on_cuda(both, ring, slot, pos)):
        return "operands not on a CUDA device"
    if not (isinstance(both, torch.Tensor) and both.dim() == 2 and both.dtype in FLOATS and both.is_contiguous()
            and isinstance(ring, torch.Tensor) and ring.dim() == 3 and ring.is_contiguous()):
        return "both / ring layouts or dtypes not covered"
    return None


def supports_ring_pair(both: torch.Tensor, ring: torch.Tensor, slot: torch.Tensor, pos: torch.Tensor) -> bool:
    """CUDA contiguous both [T, 2d] fp32/bf16/fp16 and ring [S, C, 2d] (the contract's other checks raise)."""
    return _ring_uncovered(both, ring, slot, pos, False) is None


def ring_pair_pool(both: torch.Tensor, ring: torch.Tensor, slot: torch.Tensor, pos: torch.Tensor, *,
                   force_kernel: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``compress.ring_pair_pool``: (u [T, d] in both's dtype, closes [T] bool, ring written in place). Slots must be
    distinct (one row a request, as a decode step has); the reference's contract errors are raised first."""
    check_ring_pair_pool(both, ring, slot, pos)
    why = _ring_uncovered(both, ring, slot, pos, force_kernel)
    if why:
        return hand_off("compress.ring_pair_pool", why, ref_ring_pair_pool, both, ring, slot, pos)
    t, w = both.shape
    d = w // 2
    u = torch.empty(t, d, dtype=both.dtype, device=both.device)
    closes = torch.empty(t, dtype=torch.bool, device=both.device)
    if t == 0 or d == 0:
        return u, closes, ring
    block_d = min(next_pow2(d), _BLOCK_D)
    _ring_pair_kernel[(t, triton.cdiv(d, block_d))](both, ring, slot, pos, u, closes, ring.shape[0], d, ring.shape[1],
                                                   BLOCK_D=block_d, num_warps=2)
    return u, closes, ring
