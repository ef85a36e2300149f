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


@pytest.mark.parametrize("t", [1, 37, 8192])
def test_hash_ids_model_width(t):
    """``engram.hash_ids`` (``triton_engram_hash.py``) with V4.1's shapes (2 Engram layers, 4-grams, 8 heads: 24
    columns), its real primes and multipliers, invalid columns anywhere: equal to the reference, poisoned output,
    and a CUDA graph replayed with a fresh window."""
    from deepinfer_core.kernels.ops.engram import hash_ids
    from deepinfer_models.deepseek_v41.engram_hash import engram_multipliers, engram_offsets, engram_primes
    from deepinfer_nvidia.kernels import triton_engram_hash as th

    primes = engram_primes(2, 4, 8, 1_000_000)
    p, o = torch.tensor(primes), torch.tensor(engram_offsets(primes))
    m = torch.tensor(engram_multipliers((3, 11), 4, 129280))
    g = torch.Generator().manual_seed(t)
    tm = torch.randint(0, 129280, (129280,), generator=g)

    def window_valid(seed):
        gg = torch.Generator().manual_seed(seed)
        return torch.randint(0, 129280, (t, 4), generator=gg), torch.rand(t, 4, generator=gg) > 0.1

    w, v = window_valid(t)
    cu = [x.cuda() for x in (tm, m, p, o)]
    _poison()
    out = th.hash_ids(w.cuda(), v.cuda(), cu[0], 5, *cu[1:])
    assert torch.equal(out.cpu(), hash_ids(w, v, tm, 5, m, p, o))
    wc, vc = w.cuda(), v.cuda()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = th.hash_ids(wc, vc, cu[0], 5, *cu[1:])
    w2, v2 = window_valid(t + 1)
    wc.copy_(w2)
    vc.copy_(v2)
    graph.replay()
    assert torch.equal(y.cpu(), hash_ids(w2, v2, tm, 5, m, p, o))
