"""Triton interleaved RoPE on the tail of each vector (``rope.interleaved``).

One program handles ``ROWS`` vectors (heads) of one token: the untouched head of
each vector is copied, the tail's adjacent pairs are rotated. Angles are formed
in fp64 (``position * inv_freq`` exactly as the reference does) and reduced
modulo 2*pi in fp64 before the fp32 cos/sin: at position 10^6 an fp32 angle
would already be off by ~0.06 rad, far outside the fp32 tolerance.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_core.kernels.ops.rope import apply_rope
from deepinfer_nvidia.kernels._common import FLOATS, hand_off, next_pow2, on_cuda
from deepinfer_nvidia.kernels.triton_pdl import pdl_enter, pdl_launch

_TWO_PI = 6.283185307179586


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
    p = tl.load(pos_ptr + t).to(tl.float64)
    f = tl.load(f_ptr + i, mask=imask, other=0.0).to(tl.float64)
    ang = p * f  # >= 0: positions and frequencies are non-negative
    turns = (ang * (1.0 / 6.283185307179586)).to(tl.int64).to(tl.float64)
    red = (ang - turns * 6.283185307179586).to(tl.float32)
    c = tl.cos(red)
    s = tl.sin(red)
    if INVERSE:
        s = -s
    tmask = rmask[:, None] & imask[None, :]
    ta = base[:, None] + (D - rd) + 2 * i[None, :]
    a = tl.load(x_ptr + ta, mask=tmask, other=0.0).to(tl.float32)
    b = tl.load(x_ptr + ta + 1, mask=tmask, other=0.0).to(tl.float32)
    ra = a * c[None, :] - b * s[None, :]
    rb = b * c[None, :] + a * s[None, :]
    tl.store(y_ptr + ta, ra.to(y_ptr.dtype.element_ty), mask=tmask)
    tl.store(y_ptr + ta + 1, rb.to(y_ptr.dtype.element_ty), mask=tmask)


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
