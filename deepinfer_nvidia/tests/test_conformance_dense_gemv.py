"""``gemm.dense``'s Triton GEMV (``triton_dense_gemv.py``) at DeepSeek-V4.1 widths on the GPU, with the allocator
poisoned with NaN first: the router [384, 5120] and the compressors' wkv [512, 5120] / index wk [128, 5120] in fp32,
bf16 projections, 1-4 rows, against float64 sums of the same operands; the same bits on a second call and from a
captured CUDA graph (the split counters reset themselves); 5 rows and the vocabulary head go to cuBLAS; the aten
provider's opt-in split-K path at 5-64 rows. Skipped without a GPU; the shared harness cases are in test_conformance.py."""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")

from deepinfer_nvidia.tests.test_conformance import poison as _poison  # noqa: E402  (the shared NaN fill)

SHAPES = [(384, 5120), (512, 5120), (128, 5120), (1024, 4096), (37, 300)]


# (rows, DEEPINFER_NV_DENSE_ONE_PASS): the one-pass launch serves one row, so it is paired with 1 only
@pytest.mark.parametrize("rows,one_pass", [(1, False), (1, True), (2, False), (3, False), (4, False)])
@pytest.mark.parametrize("xd,wd", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                   (torch.bfloat16, torch.float32)])
def test_model_widths(rows, xd, wd, one_pass, monkeypatch):
    """``one_pass``: ``DEEPINFER_NV_DENSE_ONE_PASS`` (a row's call over the whole K in one tile; 1 row only)."""
    from deepinfer_nvidia.kernels import triton_dense_gemv as dg

    monkeypatch.setattr(dg, "ONE_PASS", one_pass)

    g = torch.Generator().manual_seed(rows)
    for n, k in SHAPES:
        x = torch.randn(rows, k, generator=g).to(xd).cuda()
        w = (torch.randn(n, k, generator=g) / k ** 0.5).to(wd).cuda()
        assert dg.takes(x, w)
        exact = (x.double() @ w.to(xd).double().t())
        _poison()
        y = dg.gemm_dense(x, w)
        assert y.dtype == xd and not torch.isnan(y.float()).any()
        if xd == torch.float32:
            assert (y.double() - exact).abs().max() <= 1e-5 * max(1.0, exact.abs().max().item()), (n, k)
        else:  # round to nearest of an fp32 sum: within half a unit of bf16 plus the fp32 error
            unit = torch.exp2(torch.floor(torch.log2(exact.abs().clamp_min(1e-30))) - 7)
            assert ((y.double() - exact).abs() <= 0.5 * unit + 1e-5 * exact.abs().max()).all(), (n, k)
        assert torch.equal(y, dg.gemm_dense(x, w))


@pytest.mark.parametrize("one_pass", [False, True])
def test_graph_replay_and_cublas_cases(one_pass, monkeypatch):
    from deepinfer_nvidia.kernels import triton_dense_gemv as dg

    monkeypatch.setattr(dg, "ONE_PASS", one_pass)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(1, 5120, generator=g).cuda()
    w = torch.randn(384, 5120, generator=g).cuda() / 70
    eager = dg.gemm_dense(x, w)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        dg.gemm_dense(x, w)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = dg.gemm_dense(x, w)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)
    x5 = torch.randn(5, 5120, generator=g).cuda()
    assert not dg.takes(x5, w)
    assert torch.equal(dg.gemm_dense(x5, w), x5 @ w.t())  # the cuBLAS call itself
    head = torch.randn(16384, 5120, generator=g, dtype=torch.bfloat16).cuda()
    assert not dg.takes(x.bfloat16(), head)  # 84 M elements: cuBLAS


@pytest.mark.parametrize("splits", [4, 8, 16])
@pytest.mark.parametrize("rows", [5, 32, 64])
def test_aten_splitk(rows, splits):
    """The ``aten`` provider's opt-in split-K path (``DEEPINFER_NV_DENSE_SPLITK``) at V4's fp32 widths: within fp32
    sums of float64, the same bits on a second call and from a captured CUDA graph."""
    from deepinfer_nvidia.kernels import aten_ops

    g = torch.Generator().manual_seed(rows * splits)
    for n, k in [(256, 4096), (512, 4096), (1024, 4096), (384, 5120)]:
        x = torch.randn(rows, k, generator=g).cuda()
        w = (torch.randn(n, k, generator=g) / k ** 0.5).cuda()
        assert aten_ops.splitk_takes(x, w, splits)
        exact = x.double() @ w.double().t()
        _poison()
        got = aten_ops.splitk_mm(x, w, splits)
        assert (got.double() - exact).abs().max().item() <= 1e-5 * max(1.0, exact.abs().max().item())
        assert torch.equal(got, aten_ops.splitk_mm(x, w, splits))
        graph = torch.cuda.CUDAGraph()
        aten_ops.splitk_mm(x, w, splits)  # warm-up (cuBLAS workspace) outside the capture
        with torch.cuda.graph(graph):
            out = aten_ops.splitk_mm(x, w, splits)
        out.zero_()
        graph.replay()
        assert torch.equal(out, got)


@pytest.mark.parametrize("rows,one_pass", [(1, False), (1, True), (2, False), (4, False), (5, False), (64, False)])
@pytest.mark.parametrize("xd", [torch.bfloat16, torch.float32])
def test_dense_wide(rows, xd, one_pass, monkeypatch):
    """``gemm.dense_wide`` (the router and the compressors' fp32 projections of a bf16 x): 1-4 rows through the GEMV
    widening x in the kernel, 5 and 64 through the cast and cuBLAS; fp32 out within fp32 sums of the exact products
    (the weight is not rounded), the same bits as ``gemm_dense`` of the widened x on the GEMV path; a bf16 weight
    gives its fp32 copy's bits. ``one_pass``: ``DEEPINFER_NV_DENSE_ONE_PASS`` (1 row only)."""
    from deepinfer_nvidia.kernels import triton_dense_gemv as dg

    monkeypatch.setattr(dg, "ONE_PASS", one_pass)

    g = torch.Generator().manual_seed(40 + rows)
    for n, k in SHAPES:
        x = torch.randn(rows, k, generator=g).to(xd).cuda()
        w = (torch.randn(n, k, generator=g) / k ** 0.5).cuda()
        exact = x.double() @ w.double().t()
        _poison()
        y = dg.gemm_dense_wide(x, w)
        assert y.dtype == torch.float32 and not torch.isnan(y).any()
        assert (y.double() - exact).abs().max() <= 1e-5 * max(1.0, exact.abs().max().item()), (rows, n, k)
        if rows <= 4:
            assert torch.equal(y, dg.gemm_dense(x.float(), w)), (rows, n, k)  # the same sums in the same order
        # the weight as a checkpoint stores it (bf16): widened in the kernel, the products of its fp32 copy, bit for bit
        wh = w.bfloat16()
        _poison()
        yh = dg.gemm_dense_wide(x, wh)
        assert yh.dtype == torch.float32 and torch.equal(yh, dg.gemm_dense_wide(x, wh.float())), (rows, n, k)


@pytest.mark.parametrize("rows", [5, 32])
def test_dense_wide_keeps_a_half_weights_copy(rows):
    """Above the GEMV's rows a bf16 weight is multiplied through its fp32 copy, made by the first call outside a
    capture and kept (``wide_copies``): the fp32 weight's bits, one copy however many calls, and a graph captured
    after it replays from it; a weight first seen inside a capture is cast in the graph (correct, nothing kept)."""
    from deepinfer_nvidia.kernels import triton_dense_gemv as dg
    from deepinfer_nvidia.kernels import wide_copies

    g = torch.Generator().manual_seed(70 + rows)
    x = torch.randn(rows, 5120, generator=g).bfloat16().cuda()
    w = (torch.randn(384, 5120, generator=g) / 70).bfloat16().cuda()
    want = dg.gemm_dense_wide(x, w.float())
    n = wide_copies.kept()
    assert torch.equal(dg.gemm_dense_wide(x, w), want) and wide_copies.kept() == n + 1
    assert torch.equal(dg.gemm_dense_wide(x, w), want) and wide_copies.kept() == n + 1
    fresh = (torch.randn(384, 5120, generator=g) / 70).bfloat16().cuda()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = dg.gemm_dense_wide(x, w)
        out_fresh = dg.gemm_dense_wide(x, fresh)
    assert wide_copies.kept() == n + 1  # nothing kept from inside the capture
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want) and torch.equal(out_fresh, dg.gemm_dense_wide(x, fresh.float()))
