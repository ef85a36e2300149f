"""Triton RMSNorm (``norm.rms`` and ``norm.rms_unweighted``).

One program normalises ``ROWS`` rows: the whole row is loaded once (the widest
row in V4 is 4096 wide in the model, 16384 for the flattened mHC residual, which
is not normed here), the mean square is reduced in fp32 and the row written once:
2 bytes read + 2 written per element in bf16, the memory floor.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_core.kernels.ops.norm import rms_norm, rms_norm_unweighted
from deepinfer_nvidia.kernels._common import FLOATS, hand_off, next_pow2, on_cuda
from deepinfer_nvidia.kernels.triton_pdl import pdl_enter, pdl_launch


@triton.jit
def _rms_kernel(x_ptr, w_ptr, y_ptr, n_rows, n_cols, eps, HAS_W: tl.constexpr,
                ROWS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = 0):
    pdl_enter(PDL)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    rmask = rows < n_rows
    cmask = cols < n_cols
    mask = rmask[:, None] & cmask[None, :]
    offs = rows.to(tl.int64)[:, None] * n_cols + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    xf = x.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=1) / n_cols + eps)
    if HAS_W:
        w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
        y = w[None, :] * (xf * inv[:, None])
    else:
        # The unweighted reference rounds the fp32 scale to x.dtype, then multiplies in x.dtype;
        # the fp32 product of two such values rounded once to x.dtype is that same product.
        y = xf * inv[:, None].to(x.dtype).to(tl.float32)
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def _launch(x: torch.Tensor, w: torch.Tensor | None, eps: float) -> torch.Tensor:
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    y = torch.empty_like(x2)
    rows = x2.shape[0]
    if rows == 0:
        return y.view(x.shape)
    block = next_pow2(n)
    # Keep about 8k elements per program: few rows for wide rows, more for narrow ones.
    rows_per = max(1, min(64, 8192 // block))
    warps = 4 if block * rows_per <= 4096 else 8
    grid = (triton.cdiv(rows, rows_per),)
    _rms_kernel[grid](x2, w if w is not None else x2, y, rows, n, float(eps), HAS_W=w is not None,
                      ROWS=rows_per, BLOCK=block, num_warps=warps, **pdl_launch())
    return y.view(x.shape)


def supports_rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> bool:
    """CUDA float (fp32/bf16/fp16) x with a CUDA weight of the row width, rows up to 16384 wide."""
    return (on_cuda(x, weight) and x.dtype in FLOATS and weight.dtype in FLOATS and weight.dim() == 1
            and x.dim() >= 1 and weight.shape[0] == x.shape[-1] and x.shape[-1] <= 16384)


def rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``norm.rms``: x [..., N], weight [N] -> ``w * x * rsqrt(mean(x^2) + eps)`` in x.dtype (fp32 math)."""
    if not supports_rms(x, weight, eps):
        return hand_off("norm.rms", f"operands {x.dtype}/{weight.dtype} on {x.device} not covered",
                        rms_norm, x, weight, eps)
    return _launch(x.contiguous(), weight.contiguous(), eps)


def supports_rms_unweighted(x: torch.Tensor, eps: float) -> bool:
    return on_cuda(x) and x.dtype in FLOATS and x.dim() >= 1 and x.shape[-1] <= 16384


def rms_unweighted(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``norm.rms_unweighted``: x [..., N] -> ``x * rsqrt(mean(x^2) + eps)`` (scale rounded to x.dtype)."""
    if not supports_rms_unweighted(x, eps):
        return hand_off("norm.rms_unweighted", f"operands {x.dtype} on {x.device} not covered",
                        rms_norm_unweighted, x, eps)
    return _launch(x.contiguous(), None, eps)
