"""fp32 ``gemm.dense`` (provider ``triton``: tf32x3 from ``MIN_ROWS`` rows, cuBLAS below) and the tf32x3
``mhc.mix`` projection at prefill sizes, on the GPU against float64 (skipped without one). Outputs start as
NaN (poisoned allocator), so an element a tile forgot to write fails."""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")


def _poison() -> None:
    torch.cuda.synchronize()
    blobs = [torch.full((64 << 20,), float("nan"), device="cuda") for _ in range(4)]
    del blobs
    torch.cuda.synchronize()


@pytest.mark.parametrize("t", [8, 1024, 2053])
@pytest.mark.parametrize("n,k", [(512, 5120), (128, 5120), (129, 4100)])
def test_dense_fp32_against_float64(t, n, k):
    from deepinfer_nvidia.kernels import triton_dense_fp32 as td

    g = torch.Generator(device="cuda").manual_seed(t + n)
    x = torch.randn(t, k, generator=g, device="cuda")
    w = torch.randn(n, k, generator=g, device="cuda") / k ** 0.5
    ref = x.double() @ w.double().t()
    _poison()
    y = td.gemm_dense_tf32x3(x, w)
    assert y.dtype == torch.float32 and y.shape == (t, n) and not torch.isnan(y).any()
    err = ((y.double() - ref).abs().max() / ref.abs().max()).item()
    # tf32x3: ~2^-21 per product; cuBLAS fp32 below MIN_ROWS: 2^-24
    assert err < (2e-6 if t >= td.MIN_ROWS else 1e-6), err


@pytest.mark.parametrize("t", [1024, 1031, 4100])
def test_mix_prefill_launch_against_reference(t):
    from deepinfer_core.kernels.ops.mhc import mhc_mix
    from deepinfer_nvidia.kernels import triton_mhc as tm

    g = torch.Generator(device="cuda").manual_seed(t)
    n, d = 4, 5120
    r = torch.randn(t, n, d, generator=g, device="cuda").bfloat16()
    fn = torch.randn((2 + n) * n, n * d, generator=g, device="cuda") / (n * d) ** 0.5
    base = torch.randn((2 + n) * n, generator=g, device="cuda")
    scale = torch.rand(3, generator=g, device="cuda") + 0.5
    ref = mhc_mix(r.double(), fn.double(), base.double(), scale.double(), 1e-6, 1e-6, 20)
    _poison()
    out = tm.mix(r, fn, base, scale, 1e-6, 1e-6, 20)
    for o, rr in zip(out, ref):
        assert not torch.isnan(o).any()
        torch.testing.assert_close(o.double(), rr, atol=2e-5, rtol=2e-5)
