"""``gemm.dense``'s Triton GEMM (``deepinfer_nvidia/kernels/triton_gemm.py:gemm_dense``, tf32x3 for fp32 prefill
rows on the GPU) in Triton's CPU interpreter against the reference: ragged tiles (M, N, K not multiples of the
128 x 128 x 32 tile), a weight in another dtype (cast in the kernel), and the reference's shape errors."""
from __future__ import annotations

_INTERPRETED = r"""
import torch
from deepinfer_core.kernels.ops.gemm import dense
from deepinfer_nvidia.kernels import triton_gemm as tg

g = torch.Generator().manual_seed(0)
n = 0
for m, nn, k, wdtype in ((130, 200, 72, torch.float32), (5, 64, 40, torch.float32), (129, 33, 96, torch.bfloat16)):
    x = torch.randn(m, k, generator=g)
    w = torch.randn(nn, k, generator=g).to(wdtype)
    torch.testing.assert_close(tg.gemm_dense(x, w, force_kernel=True), dense(x, w), atol=1e-4, rtol=1e-4)
    n += 1
try:
    tg.gemm_dense(torch.randn(4, 8), torch.randn(3, 9), force_kernel=True)
except ValueError as exc:
    assert "gemm.dense" in str(exc), exc
    n += 1
print("DENSE_OK", n)
"""


def test_dense_gemm_in_the_interpreter(run_interpreted):
    run_interpreted(_INTERPRETED, "DENSE_OK 4")
