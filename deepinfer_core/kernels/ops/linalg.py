"""Batch-invariant matmul for the CPU references.

BLAS picks different kernels and reduction orders for different numbers of rows,
so ``(x @ W.T)[i]`` changes in the last bits with the batch it sits in. The
references instead push every row through a GEMM of exactly ``ROW_TILE`` rows
(zero-padded), which makes each row's result independent of how many other rows
are in the step and where the row sits (checked by tests/kernels/test_linalg.py).
That is what lets the engine's invariants (batched == alone, chunked ==
unchunked, preempted == not) hold bit for bit in fp32 on the CPU.
"""
from __future__ import annotations

import torch

ROW_TILE = 8


def linear_rows(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x [T, K] @ w [N, K]^T -> [T, N]`` (w cast to x.dtype), row-tile invariant."""
    w = w.to(x.dtype)
    t = x.shape[0]
    if t == 0:
        return x.new_zeros(0, w.shape[0])
    pad = (-t) % ROW_TILE
    if pad:
        x = torch.cat([x, x.new_zeros(pad, x.shape[1])])
    wt = w.t()
    return torch.cat([chunk @ wt for chunk in x.split(ROW_TILE)])[:t]


def up(x: torch.Tensor) -> torch.Tensor:
    """One precision up for transcendentals (fp32 -> fp64, bf16/fp16 -> fp32, fp64 stays).

    ATen evaluates exp/sigmoid/cos/... with a vectorised approximation in the
    main loop and the libm scalar in the tail, so an element's bits depend on where
    it sits in the tensor, i.e. on the batch. Evaluating one precision up and
    rounding back (``down``) makes both paths agree except for results within one
    fp64 ulp of an fp32 rounding boundary (~2^-29 per element).
    """
    if x.dtype == torch.float64:
        return x
    return x.double() if x.dtype == torch.float32 else x.float()


def down(y: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Round a result of ``up`` back to the accumulation dtype of ``like`` (fp32, or fp64 for fp64)."""
    return y if like.dtype == torch.float64 else y.float()
