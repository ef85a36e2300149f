"""Triton ``moe.clamped_swiglu``: the shared expert's activation as one launch.

Why: written as torch ops (``deepinfer_core.kernels.ops.moe.clamped_swiglu``) the activation is five small
kernels a layer (clamp, upcast, silu, cast, clamp and multiply), none of which takes part in the decode step's
programmatic-dependent-launch chain, so at batch 1 each costs a dependent launch and the shared expert's ``w2``
GEMV cannot request its weights while they run (``benchmarks/step_glue_ops.py``: 50 of the 326 glue ops of a
10-layer V4.1 batch-1 step). Here one program covers ``BLOCK`` columns of one row, reads gate and up through
their own row strides (column slices of one merged ``w1 | w3`` product need no copy) and writes the product.

Numerics match the reference: the silu in fp32 for bf16 / fp16 inputs (fp64 for fp32 inputs, as the reference's
``up``), rounded to the input dtype, then the product of two values of that dtype rounded once. Elementwise, so
batch-invariant.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_core.kernels.ops.moe import clamped_swiglu as clamped_swiglu_reference
from deepinfer_nvidia.kernels._common import FLOATS, hand_off, on_cuda
from deepinfer_nvidia.kernels.triton_pdl import pdl_enter, pdl_launch

BLOCK = 1024  # columns a program: three programs a row at V4.1-Flash's shared width 2304


@triton.jit
def _swiglu_kernel(g_ptr, u_ptr, y_ptr, n_cols, stride_g, stride_u, limit, UP64: tl.constexpr,
                   BLOCK: tl.constexpr, PDL: tl.constexpr = 0):
    """Program (row, column block): ``y = silu(min(g, L)) * clamp(u, -L, L)``; g, u read with their row strides,
    y contiguous [T, n_cols] in g's dtype."""
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    g = tl.load(g_ptr + row * stride_g + cols, mask=mask, other=0.0)
    u = tl.load(u_ptr + row * stride_u + cols, mask=mask, other=0.0)
    # clamped in fp32 and rounded back, as torch clamps a half-precision tensor by a scalar (exact in fp32)
    g = tl.minimum(g.to(tl.float32), limit).to(g.dtype)
    u = tl.minimum(tl.maximum(u.to(tl.float32), -limit), limit).to(u.dtype)
    gu = g.to(tl.float64) if UP64 else g.to(tl.float32)
    act = (gu / (1.0 + tl.exp(-gu))).to(g.dtype)  # silu one precision up, rounded to the dtype
    y = (act.to(tl.float32) * u.to(tl.float32)).to(g.dtype) if not UP64 else act * u
    tl.store(y_ptr + row * n_cols + cols, y, mask=mask)


def supports(gate: torch.Tensor, up: torch.Tensor, limit: float) -> bool:
    """CUDA float gate and up of one shape and dtype, 2-D with unit column stride (any row stride)."""
    return (on_cuda(gate, up) and gate.dtype in FLOATS and up.dtype == gate.dtype and gate.dim() == 2
            and gate.shape == up.shape and gate.stride(1) == 1 and up.stride(1) == 1)


def clamped_swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
    """``moe.clamped_swiglu``: gate, up [T, F] -> [T, F] in gate's dtype (see the module docstring)."""
    if not supports(gate, up, limit):
        return hand_off("moe.clamped_swiglu", f"operands {gate.dtype}/{up.dtype} {tuple(gate.shape)} on "
                        f"{gate.device} not covered", clamped_swiglu_reference, gate, up, limit)
    return _launch(gate, up, limit)


def _launch(gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
    """The launch itself (the CPU interpreter tests call it on CPU tensors)."""
    t, f = gate.shape
    y = torch.empty(t, f, dtype=gate.dtype, device=gate.device)
    if t == 0 or f == 0:
        return y
    _swiglu_kernel[(t, triton.cdiv(f, BLOCK))](gate, up, y, f, gate.stride(0), up.stride(0), float(limit),
                                               UP64=gate.dtype == torch.float32, BLOCK=BLOCK, num_warps=4,
                                               **pdl_launch())
    return y
