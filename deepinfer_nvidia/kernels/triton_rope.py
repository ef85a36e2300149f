"""Triton interleaved RoPE on the tail of each vector (``rope.interleaved``), and RMSNorm with it
(``norm.rms_rope``, below).

One program handles ``ROWS`` vectors (heads) of one token: the untouched head of
each vector is copied, the tail's adjacent pairs are rotated. Angles are formed
in fp64 (``position * inv_freq`` exactly as the reference does) and reduced
modulo 2*pi in fp64 before the fp32 cos/sin: at position 10^6 an fp32 angle
would already be off by ~0.06 rad, far outside the fp32 tolerance.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from deepinfer_core.kernels.ops.rope import apply_rope
from deepinfer_nvidia.kernels._common import FLOATS, hand_off, next_pow2, on_cuda
from deepinfer_nvidia.kernels.triton_pdl import pdl_enter, pdl_launch

_TWO_PI = 6.283185307179586


@triton.jit
def pair_angles(t, i, imask, pos_ptr, f_ptr, INVERSE: tl.constexpr):
    """cos and sin (fp32) of token ``t``'s angles ``position * inv_freq[i]`` for the pair lanes ``i`` (masked by
    ``imask``), formed and reduced modulo 2*pi in fp64 (above), as every rope kernel here forms them; sin negated for
    ``INVERSE``."""
    return angles_at(tl.load(pos_ptr + t), i, imask, f_ptr, INVERSE)


@triton.jit
def angles_at(position, i, imask, f_ptr, INVERSE: tl.constexpr):
    """``pair_angles`` of a position already loaded (an integer scalar >= 0)."""
    p = position.to(tl.float64)
    ang = p * tl.load(f_ptr + i, mask=imask, other=0.0).to(tl.float64)  # >= 0 (non-negative factors)
    turns = (ang * (1.0 / 6.283185307179586)).to(tl.int64).to(tl.float64)
    red = (ang - turns * 6.283185307179586).to(tl.float32)
    c = tl.cos(red)
    s = tl.sin(red)
    if INVERSE:
        s = -s
    return c, s


@triton.jit
def _rope_kernel(x_ptr, y_ptr, pos_ptr, f_ptr, n_rows, D, HALF: tl.constexpr, INVERSE: tl.constexpr,
                 ROWS: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr = 0):
    pdl_enter(PDL)
    t = tl.program_id(0)
    rows = tl.program_id(1) * ROWS + tl.arange(0, ROWS)
    rmask = rows < n_rows
    base = (t.to(tl.int64) * n_rows + rows.to(tl.int64)) * D  # [ROWS]
    rd = 2 * HALF
    # 1) copy the non-rotated head
    cols = tl.arange(0, BLOCK_D)
    hmask = rmask[:, None] & (cols[None, :] < D - rd)
    xh = tl.load(x_ptr + base[:, None] + cols[None, :], mask=hmask, other=0.0)
    tl.store(y_ptr + base[:, None] + cols[None, :], xh, mask=hmask)
    # 2) rotate the tail pairs (2i, 2i+1), i < HALF
    i = tl.arange(0, BLOCK_H)
    imask = i < HALF
    c, s = pair_angles(t, i, imask, pos_ptr, f_ptr, INVERSE)
    tmask = rmask[:, None] & imask[None, :]
    ta = base[:, None] + (D - rd) + 2 * i[None, :]
    a = tl.load(x_ptr + ta, mask=tmask, other=0.0).to(tl.float32)
    b = tl.load(x_ptr + ta + 1, mask=tmask, other=0.0).to(tl.float32)
    ra = a * c[None, :] - b * s[None, :]
    rb = b * c[None, :] + a * s[None, :]
    tl.store(y_ptr + ta, ra.to(y_ptr.dtype.element_ty), mask=tmask)
    tl.store(y_ptr + ta + 1, rb.to(y_ptr.dtype.element_ty), mask=tmask)


@triton.jit
def rotate_tail(x, x_sw, d, D, t, pos_ptr, f_ptr, HALF: tl.constexpr, INVERSE: tl.constexpr):
    """For kernels that fuse the rotation: x, x_sw fp32 tiles [..., BLOCK_D] of vectors of token ``t`` whose lane
    holds channel ``d`` ([BLOCK_D] int) and, in ``x_sw``, channel ``d ^ 1`` (the pair partner; D - 2*HALF even).
    Returns x with channels [D - 2*HALF, D) rotated as ``_rope_kernel`` rotates them (``pair_angles`` and the same
    fp32 products: a' = a cos - b sin on even channels, b' = b cos + a sin on odd ones), the rest as they are."""
    rd = 2 * HALF
    tail = (d >= D - rd) & (d < D)
    c, s = pair_angles(t, tl.where(tail, (d - (D - rd)) // 2, 0), tail, pos_ptr, f_ptr, INVERSE)
    r = tl.where((d % 2) == 0, x * c - x_sw * s, x * c + x_sw * s)
    return tl.where(tail, r, x)


def supports(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, inverse: bool = False) -> bool:
    """CUDA fp32/bf16/fp16 x [T, ..., D] (D <= 8192), integer positions [T], float inv_freq with 2*len <= D."""
    return (on_cuda(x, positions, inv_freq) and x.dtype in FLOATS and x.dim() >= 2 and x.shape[-1] <= 8192
            and not positions.is_floating_point() and positions.dim() == 1
            and inv_freq.dim() == 1 and inv_freq.is_floating_point() and 2 * inv_freq.shape[0] <= x.shape[-1])


def rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """``rope.interleaved``: rotate the last ``2*len(inv_freq)`` channels of x [T, ..., D]; returns a new tensor."""
    if not supports(x, positions, inv_freq, inverse):
        return hand_off("rope.interleaved", f"operands {x.dtype} {tuple(x.shape)} on {x.device} not covered",
                        apply_rope, x, positions, inv_freq, inverse=inverse)
    if positions.shape[0] != x.shape[0]:
        raise ValueError(f"rope.interleaved: positions has {positions.shape[0]} entries for {x.shape[0]} tokens")
    t, d = x.shape[0], x.shape[-1]
    xc = x.contiguous()
    y = torch.empty_like(xc)
    rows = xc.numel() // max(1, t * d) if t else 0
    if t == 0 or rows == 0:
        return y
    half = inv_freq.shape[0]
    block_d = next_pow2(d)
    rows_per = max(1, min(next_pow2(rows), 4096 // block_d, 16))
    grid = (t, triton.cdiv(rows, rows_per))
    _rope_kernel[grid](xc, y, positions.contiguous(), inv_freq.contiguous(), rows, d, HALF=half,
                       INVERSE=bool(inverse), ROWS=rows_per, BLOCK_D=block_d, BLOCK_H=next_pow2(half),
                       num_warps=4, **pdl_launch())
    return y


# -- norm.rms_rope: RMSNorm and the tail rotation in one launch (two as parts) -------------------------------------
@triton.jit
def _rms_rope_kernel(x_ptr, w_ptr, y_ptr, pos_ptr, f_ptr, n_rows, D, eps, HALF: tl.constexpr, BLOCK: tl.constexpr,
                     BLOCK_H: tl.constexpr, PDL: tl.constexpr = 0):
    """One program a vector (token t, row r of its ``n_rows``): ``y = w * x * rsqrt(mean(x^2) + eps)`` rounded to
    y's dtype as ``norm.rms`` stores it, then the tail pairs of those rounded values rotated as ``_rope_kernel``
    does. The tail's pairs are loaded again (even and odd lanes, L1 hits) and normed with the same fp32 ops, so
    they are the bits the full-row pass computed."""
    pdl_enter(PDL)
    t = tl.program_id(0)
    base = (t.to(tl.int64) * n_rows + tl.program_id(1)) * D
    cols = tl.arange(0, BLOCK)
    cmask = cols < D
    x = tl.load(x_ptr + base + cols, mask=cmask, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
    w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    tl.store(y_ptr + base + cols, (w * (x * inv)).to(y_ptr.dtype.element_ty), mask=cols < D - 2 * HALF)
    i = tl.arange(0, BLOCK_H)
    imask = i < HALF
    ca, a, b = normed_tail_pairs(x_ptr + base, w_ptr, inv, i, imask, D, HALF, y_ptr.dtype.element_ty)
    c, s = pair_angles(t, i, imask, pos_ptr, f_ptr, False)
    tl.store(y_ptr + base + ca, (a * c - b * s).to(y_ptr.dtype.element_ty), mask=imask)
    tl.store(y_ptr + base + ca + 1, (b * c + a * s).to(y_ptr.dtype.element_ty), mask=imask)


@triton.jit
def normed_tail_pairs(row_ptr, w_ptr, inv, i, imask, D, HALF: tl.constexpr, RND: tl.constexpr):
    """For kernels that norm a vector and rotate its tail: the tail's pairs (channels ``ca = D - 2*HALF + 2i`` and
    ``ca + 1`` for the lanes ``i``, masked by ``imask``) of the vector at ``row_ptr`` normed again with the full-row
    pass's fp32 steps (``w * (x * inv)``, ``inv`` its rsqrt), so the same values, rounded to RND as ``norm.rms``
    stores them and widened back: ``(ca, a, b)``, a and b fp32 [BLOCK_H]. The loads are L1 hits after the row's."""
    ca = (D - 2 * HALF) + 2 * i
    a = (tl.load(w_ptr + ca, mask=imask, other=0.0).to(tl.float32)
         * (tl.load(row_ptr + ca, mask=imask, other=0.0).to(tl.float32) * inv))
    b = (tl.load(w_ptr + ca + 1, mask=imask, other=0.0).to(tl.float32)
         * (tl.load(row_ptr + ca + 1, mask=imask, other=0.0).to(tl.float32) * inv))
    return ca, a.to(RND).to(tl.float32), b.to(RND).to(tl.float32)


RMS_ROPE_MAX_D = 8192  # the row is held in registers
# On since the forty-sixth pass, with ``compress.entry_write``'s kernel (H100, pass46c/d, both knobs together, six
# readings an arm: batch 1 2.050 -> 2.042 ms pipelined, batch 32 12.325 -> 12.288, both inside the spread and never
# slower; alone it measured even in the thirty-first and forty-third passes). ``DEEPINFER_NV_NORM_ROPE_FUSED=0``: off.
RMS_ROPE_FUSED = os.environ.get("DEEPINFER_NV_NORM_ROPE_FUSED", "1") == "1"


def supports_rms_rope(x, weight, eps, positions, inv_freq) -> bool:
    """CUDA fp32/bf16/fp16 x [T, ..., N] (N <= ``RMS_ROPE_MAX_D``) with a float weight [N]; positions and inv_freq
    as ``supports``."""
    return (supports(x, positions, inv_freq) and on_cuda(weight) and weight.dtype in FLOATS and weight.dim() == 1
            and weight.shape[0] == x.shape[-1] and x.shape[-1] <= RMS_ROPE_MAX_D)


def rms_rope(x: torch.Tensor, weight: torch.Tensor, eps: float, positions: torch.Tensor, inv_freq: torch.Tensor,
             force_kernel: bool = False) -> torch.Tensor:
    """``norm.rms_rope``: x [T, ..., N] -> x.dtype. The kernel by default (``DEEPINFER_NV_NORM_ROPE_FUSED=0``, read at
    import, turns it off); off, or for operands not covered, the parts (``triton_norm.rms``, then ``rope``). ``force_kernel``
    runs the kernel on CPU tensors (Triton's interpreter, tests only)."""
    from deepinfer_nvidia.kernels.triton_norm import rms

    if not (force_kernel or (RMS_ROPE_FUSED and supports_rms_rope(x, weight, eps, positions, inv_freq))):
        return rope(rms(x, weight, eps), positions, inv_freq)
    t, d = x.shape[0], x.shape[-1]
    if positions.shape[0] != t or tuple(weight.shape) != (d,) or 2 * inv_freq.shape[0] > d:
        raise ValueError(f"norm.rms_rope: x {tuple(x.shape)} needs positions [{t}], weight [{d}] and at most {d // 2} "
                         f"frequencies; got {tuple(positions.shape)}, {tuple(weight.shape)}, {tuple(inv_freq.shape)}")
    xc = x.contiguous()
    y = torch.empty_like(xc)
    rows = xc.numel() // max(1, t * d) if t else 0
    if t == 0 or rows == 0:
        return y
    block = next_pow2(d)
    half = inv_freq.shape[0]
    _rms_rope_kernel[(t, rows)](xc, weight.contiguous(), y, positions.contiguous(), inv_freq.contiguous(), rows, d,
                                float(eps), HALF=half, BLOCK=block, BLOCK_H=next_pow2(half),
                                num_warps=4 if block <= 4096 else 8, **pdl_launch())
    return y
