"""``gemm.dense``'s default NVIDIA entry (``triton_gemm.gemm_dense``) at model widths on the GPU: fp32 prefill rows
(tf32x3 Triton GEMM: the compressors' and the router's projections) against a float64 product, bf16 and small
fp32 calls (cuBLAS), with the allocator poisoned with NaN first. Skipped without a GPU."""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")


@pytest.mark.parametrize("m,n,k,dtype", [(2048, 512, 4096, torch.float32), (1030, 384, 4096, torch.float32),
                                         (8192, 1024, 4096, torch.float32), (7, 512, 4096, torch.float32),
                                         (2048, 512, 4096, torch.bfloat16)])
def test_dense_model_width(m, n, k, dtype):
    from deepinfer_nvidia.kernels import triton_gemm as tg

    g = torch.Generator().manual_seed(m + n)
    x = torch.randn(m, k, generator=g).to(dtype)
    w = (torch.randn(n, k, generator=g) * 0.02).to(dtype)
    want = (x.double() @ w.double().t())
    torch.cuda.synchronize()
    blobs = [torch.full((64 << 20,), float("nan"), device="cuda") for _ in range(4)]
    del blobs
    out = tg.gemm_dense(x.cuda(), w.cuda())
    assert out.dtype == dtype and out.shape == (m, n) and not torch.isnan(out.float()).any()
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.cpu().double(), want, atol=tol, rtol=tol)
