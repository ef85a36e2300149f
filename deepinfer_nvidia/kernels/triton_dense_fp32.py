"""fp32 ``gemm.dense`` at prefill sizes on the tensor cores, as three TF32 products (``tf32x3``).

The V4.1 compressors project the fp32 residual through fp32 weights (``wkv``, ``wgate``: x [T, 5120] @ w
[N, 5120]^T with N = 512 or 128 per layer kind). cuBLAS runs fp32 GEMMs on the CUDA cores (torch keeps
``allow_tf32`` off for matmul): 0.73 ms a call at 8192 tokens, 8 ms of the 8k prefill (fourteenth pass
profile, docs/perf/pass14b/prefill_stacks.txt). ``tf32x3`` splits each operand into a TF32 high part and a
TF32 remainder and sums hi*hi + hi*lo + lo*hi with fp32 accumulation: ~21 mantissa bits per product against
fp32's 24, the same trade ``mhc.mix`` takes for prefill-sized launches (``triton_mhc.TF32X3_MIN_T``).

Only fp32 calls of ``MIN_ROWS`` rows or more take the kernel (``supports``); the others (decode sizes, bf16
operands) run ``aten_ops.gemm_dense`` (cuBLAS; full fp32 for fp32 operands), exactly as before this provider
existed, so decode keeps cuBLAS's fp32. Not batch-invariant
(the precision depends on the row count); batch-invariant mode runs ``triton_gemm.gemm_dense_bi``.
"""
from __future__ import annotations

import torch
import triton

from deepinfer_core.kernels.ops.gemm import _check_x
from deepinfer_nvidia.kernels import aten_ops
from deepinfer_nvidia.kernels._common import on_cuda
from deepinfer_nvidia.kernels.triton_gemm import _dense_gemm_kernel

MIN_ROWS = 1024  # the prefill-sized calls; below, cuBLAS's fp32 GEMM is short and exact
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages), measured on the H200 (docs/performance.md, sixteenth pass)
TILES = (128, 128, 32, 8, 3)


def supports(x: torch.Tensor, w: torch.Tensor) -> bool:
    """CUDA fp32 x [T, K] with T >= ``MIN_ROWS`` and an fp32 w [N, K]."""
    return (on_cuda(x, w) and x.dtype == torch.float32 and w.dtype == torch.float32 and x.dim() == 2
            and x.shape[0] >= MIN_ROWS)


def gemm_dense_tf32x3(x: torch.Tensor, w: torch.Tensor, tiles: tuple | None = None,
                      force_kernel: bool = False) -> torch.Tensor:
    """``gemm.dense``: x [T, K] fp32 @ w [N, K]^T fp32 -> [T, N] fp32, tf32x3 tensor-core products.

    Other operands run ``aten_ops.gemm_dense``. ``tiles`` overrides ``TILES`` (benchmarks); ``force_kernel``
    runs CPU fp32 tensors of any row count (Triton's interpreter, tests only)."""
    if not (supports(x, w) or force_kernel):
        return aten_ops.gemm_dense(x, w)
    if w.dim() != 2:
        raise ValueError(f"gemm.dense: w must be [N, K], got shape {tuple(w.shape)}")
    _check_x(x, w.shape[1], "gemm.dense")
    m, (n, k) = x.shape[0], w.shape
    x = x if x.stride(1) == 1 else x.contiguous()
    w = w if w.stride(1) == 1 else w.contiguous()
    y = torch.empty(m, n, dtype=torch.float32, device=x.device)
    if m == 0:
        return y
    bm, bn, bk, warps, stages = tiles or TILES
    _dense_gemm_kernel[(triton.cdiv(m, bm), triton.cdiv(n, bn), 1)](
        x, w, y, m, n, k, x.stride(0), w.stride(0), n, k, SPLIT_K=1, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
        PREC="tf32x3", num_warps=warps, num_stages=stages)
    return y
