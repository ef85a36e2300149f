"""The Engram kernels (``triton_engram.py``) at DeepSeek-V4.1 widths on the GPU, with the allocator poisoned
with NaN first (an element never written shows as NaN): ``engram.gather`` (head_dim 256 FP8 rows with UE8M0
scales, 24 hashes a token) and ``engram.gate`` (4 streams of 4096), fp32 and bf16, plus batch invariance (a
token's rows equal in any batch). Skipped without a GPU; the shared harness cases are in test_conformance.py."""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")

from deepinfer_nvidia.tests.test_conformance import poison as _poison  # noqa: E402  (the shared NaN fill)


@pytest.mark.parametrize("t", [1, 37, 2048])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gather_model_width(t, dtype):
    from deepinfer_core.kernels.ops.engram import gather_rows
    from deepinfer_core.kernels.ops.quant import quant_fp8_block
    from deepinfer_nvidia.kernels import triton_engram as te

    g = torch.Generator().manual_seed(t)
    table, scale = quant_fp8_block(torch.randn(5000, 256, generator=g) * 3, (1, 32), "ue8m0")
    ids = torch.randint(0, 5000, (t, 24), generator=g)
    ref = gather_rows(table, scale, ids, dtype)
    _poison()
    out = te.gather(table.cuda(), scale.cuda(), ids.cuda(), dtype)
    assert out.dtype == dtype and not torch.isnan(out.float()).any()
    assert torch.equal(out.cpu(), ref)  # exact: a decode and a power-of-two scale
    assert torch.equal(te.gather(table.cuda(), scale.cuda(), ids[-1:].cuda(), dtype).cpu(), ref[-1:])


@pytest.mark.parametrize("t", [1, 37, 2048])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gate_model_width(t, dtype):
    from deepinfer_core.kernels.ops.engram import gate
    from deepinfer_nvidia.kernels import triton_engram as te

    g = torch.Generator().manual_seed(100 + t)
    n, d = 4, 4096
    r = torch.randn(t, n, d, generator=g).to(dtype)
    kv = torch.randn(t, (n + 1) * d, generator=g).to(dtype)
    qw, kw = 1 + 0.1 * torch.randn(n, d, generator=g), 1 + 0.1 * torch.randn(n, d, generator=g)
    ref = gate(r, kv, qw, kw, 1e-6, 1e-6)
    _poison()
    out = te.gate(r.cuda(), kv.cuda(), qw.cuda(), kw.cuda(), 1e-6, 1e-6)
    assert out.dtype == dtype and not torch.isnan(out.float()).any()
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.cpu().float(), ref.float(), atol=tol, rtol=tol)
    one = te.gate(r[-1:].cuda(), kv[-1:].cuda(), qw.cuda(), kw.cuda(), 1e-6, 1e-6)
    assert torch.equal(one, out[-1:])  # batch-invariant as registered
