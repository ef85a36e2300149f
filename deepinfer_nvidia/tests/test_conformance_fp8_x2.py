"""The FP8-``wgmma`` GEMV on split activations (``gluon_fp8_gemv_x2``, 1-16 rows on SM90) against the reference on
the GPU (skipped without an SM90 device): V4.1 widths, row counts 1-16 (each power-of-two split width and the
padding rows), [32, 32] and [128, 128] UE8M0 blocks, one and two tiles a step with K tails that end inside a
step, deep and no split-K, x with a wide range inside one 32-column block, extreme weight codes and scales, the
grouped op at the ``wo_a`` width through the registry with the switch on, graph replay (the split-K counters reset)
and a PDL chain against eager. Outputs are poisoned with NaN first."""
from __future__ import annotations

import pytest
import torch

from deepinfer_nvidia.tests.test_conformance import _gen, close, poison
from deepinfer_nvidia.tests.test_conformance_fp8_wgmma import _operands, _ref

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                                reason="needs an SM90 GPU")


def _run(x, q, s, block, **knobs):
    from deepinfer_nvidia.kernels import gluon_fp8_gemv_x2 as gx

    xc, qc, sc = x.cuda(), q.cuda(), s.view(torch.uint8).contiguous().cuda()
    poison()
    return gx.gemv_fp8x2(xc, qc, sc, sc.shape[1], block[0], block[1], 132, **knobs)


def _rel(out, ref):
    """Relative error in float64 (the extreme weights' outputs reach 1e21: fp32 norms overflow)."""
    ref = ref.double()
    return float((out.double().cpu() - ref).norm() / ref.norm())


@pytest.mark.parametrize("t", [1, 2, 3, 5, 8, 9, 16])
@pytest.mark.parametrize("n,k", [(1280, 5120), (32768, 1280), (512, 5120), (5120, 8192), (64, 128), (2304, 5120),
                                 (192, 384)])
@pytest.mark.parametrize("block", [(32, 32), (128, 128)])
@pytest.mark.parametrize("knobs", [{}, {"ksub": 1, "stages": 2}, {"programs": 64}, {"programs": 1, "ksub": 2}])
def test_fp8x2_gemv(t, n, k, block, knobs):
    if n > 5000 and t not in (1, 16) or knobs and n == 32768 and t != 1:  # keep the file's run short
        pytest.skip("covered by the other sizes")
    x, q, s = _operands(t, n, k, block, 11 * t + n + k)
    ref = _ref(x, q, s, block)
    out = _run(x, q, s, block, **knobs)
    close(out, ref.bfloat16(), 2e-2, 2e-2)
    assert _rel(out, ref) < 3e-3  # bf16 output rounding (2^-9) dominates; the split adds <= 2^-17 of a block


@pytest.mark.parametrize("t", [1, 4, 16])
def test_fp8x2_gemv_wide_range_blocks_and_zero_rows(t):
    """One 32-column block holds values from 2^-20 to 2^10 (the split's ``l`` is inexact for the smallest), one
    block is all zero, one row of x is zero: the output stays within the bf16 rounding of the reference."""
    n, k, block = 256, 1024, (32, 32)
    x, q, s = _operands(t, n, k, block, 900 + t)
    g = _gen(901 + t)
    mags = torch.pow(2.0, torch.randint(-20, 11, (t, k), generator=g).float())
    x = (torch.randn(t, k, generator=g).sign() * mags).bfloat16()
    x[:, 64:96] = 0
    if t > 1:
        x[t // 2] = 0
    ref = _ref(x, q, s, block)
    out = _run(x, q, s, block)
    close(out, ref.bfloat16(), 2e-2, 2e-2)
    assert _rel(out, ref) < 3e-3
    if t > 1:
        assert torch.all(out[t // 2].float() == 0)


@pytest.mark.parametrize("t", [1, 8])
def test_fp8x2_gemv_extreme_weights(t):
    """Every finite e4m3 code and scale bytes 0..200 (x scaled down so nothing overflows)."""
    x, q, s = _operands(t, 1024, 2048, (32, 32), 77 + t, extreme=True)
    ref = _ref(x, q, s, (32, 32))
    out = _run(x, q, s, (32, 32))
    assert _rel(out, ref) < 3e-3


def test_fp8x2_split_matches_its_host_model():
    """``split_reference`` (the CPU tests' model of the kernel's split) is what the kernel multiplies: a GEMV of an
    identity-like weight (one 1 a row, scale 1) returns x's split sum exactly (bf16-rounded)."""
    from deepinfer_nvidia.kernels import gluon_fp8_gemv_x2 as gx

    t, k = 3, 256
    g = _gen(5)
    x = (torch.randn(t, k, generator=g) * torch.pow(2.0, torch.randint(-12, 6, (t, k), generator=g).float()))
    x = x.bfloat16()
    q = torch.eye(k).to(torch.float8_e4m3fn)  # y = x exactly, through the split
    s = torch.full((k // 32, k // 32), 127, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    h, lo, sc = gx.split_reference(x)
    model = ((h.float() + lo.float()).reshape(t, k // 32, 32) * sc[..., None]).reshape(t, k)
    out = _run(x, q, s, (32, 32))
    assert torch.equal(out.cpu(), model.bfloat16())


@pytest.mark.parametrize("t", [1, 8])
def test_fp8x2_grouped_through_registry_and_graph_replay(t, monkeypatch):
    """``gemm.fp8_block_grouped`` (provider triton) at the ``wo_a`` width with the switch on takes this kernel; a
    CUDA graph of two launches replays to the same bits."""
    from deepinfer_core.kernels.ops.gemm import fp8_block_grouped
    from deepinfer_core.kernels.ops.quant import quant_fp8_block
    from deepinfer_core.kernels.registry import get_registry
    from deepinfer_core.kernels.resolve import ensure_platform_kernels
    from deepinfer_nvidia.kernels import gluon_fp8_gemv_x2 as gx
    from deepinfer_nvidia.platform import NvidiaPlatform

    monkeypatch.setitem(gx.FP8X2_TUNE, "enabled", 1)
    calls = []
    real = gx.gemv_fp8x2
    monkeypatch.setattr(gx, "gemv_fp8x2", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    reg = get_registry()
    ensure_platform_kernels(reg, NvidiaPlatform())
    fn = reg.impl("gemm.fp8_block_grouped", "triton")
    g = _gen(600 + t)
    groups, ng, kg = 8, 1024, 4096
    x = torch.randn(t, groups * kg, generator=g).bfloat16()
    q, s = quant_fp8_block(torch.randn(groups * ng, kg, generator=g) / kg ** 0.5, (32, 32), "ue8m0")
    ref = fp8_block_grouped(x, q, s, (32, 32), groups).float()
    xc, qc, sc = x.cuda(), q.cuda(), s.cuda()
    poison()
    out = fn(xc, qc, sc, (32, 32), groups)
    assert calls, "the grouped op did not take gluon_fp8_gemv_x2"
    close(out, ref.bfloat16(), 2e-2, 2e-2)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        a = fn(xc, qc, sc, (32, 32), groups)
        b = fn(xc, qc, sc, (32, 32), groups)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(a, out) and torch.equal(b, out)


@pytest.mark.parametrize("t", [1, 16])
def test_fp8x2_pdl_chain_eager_and_graphed(t):
    """A chain wq_a -> wq_b -> wo_b-like GEMVs, each reading the previous one's output, with PDL on: graphed replays
    equal the eager chain bit for bit, and the chain is within tolerance of the reference chain."""
    from deepinfer_core.kernels.ops.quant import quant_fp8_block
    from deepinfer_nvidia.kernels import gluon_fp8_gemv_x2 as gx

    g = _gen(700 + t)
    shapes = [(1280, 5120), (4096, 1280), (5120, 4096)]
    ws = []
    for n, k in shapes:
        q, s = quant_fp8_block(torch.randn(n, k, generator=g) / k ** 0.5, (32, 32), "ue8m0")
        ws.append((q, s))
    x = torch.randn(t, 5120, generator=g).bfloat16()
    ref = x
    for q, s in ws:
        ref = _ref(ref, q, s, (32, 32)).bfloat16()
    wc = [(q.cuda(), s.view(torch.uint8).contiguous().cuda()) for q, s in ws]
    static = x.cuda()

    def chain():
        h = static
        for q, s in wc:
            h = gx.gemv_fp8x2(h, q, s, s.shape[1], 32, 32, 132, pdl=True)
        return h

    eager = chain()
    close(eager, ref, 3e-2, 3e-2)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain()
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)
