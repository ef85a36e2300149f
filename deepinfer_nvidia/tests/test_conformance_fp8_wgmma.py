"""The swap-AB ``wgmma`` FP8 GEMV (``gluon_fp8_gemv``, 1-16 rows on SM90) against the reference on the GPU
(skipped without an SM90 device): V4.1 widths and tails of the row tile, [32, 32] and [128, 128] UE8M0 blocks,
both decodes (one multiply, and the exact two-multiply form with scale bytes over 0..200), deep and no
split-K, the grouped op at the ``wo_a`` width through the registry, and graph replay of the split-K fold
(its arrival counters must be back at zero after each launch). Outputs are poisoned with NaN first."""
from __future__ import annotations

import pytest
import torch

from deepinfer_nvidia.tests.test_conformance import _gen, close, poison

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                                reason="needs an SM90 GPU")


def _operands(t, n, k, block, seed, extreme=False):
    from deepinfer_core.kernels.ops.quant import quant_fp8_block

    g = _gen(seed)
    x = torch.randn(t, k, generator=g).bfloat16()
    if not extreme:
        q, s = quant_fp8_block(torch.randn(n, k, generator=g) / k ** 0.5, block, "ue8m0")
    else:  # every finite e4m3 code, scale bytes 0..200 (subnormal and huge scales: the two-multiply decode)
        q = torch.randint(0, 256, (n, k), generator=g, dtype=torch.uint8)
        q[(q & 0x7F) == 0x7F] = 0x3C  # no NaN codes
        q = q.view(torch.float8_e4m3fn)
        s = torch.randint(0, 200, (-(-n // block[0]), -(-k // block[1])), generator=g, dtype=torch.uint8)
        s = s.view(torch.float8_e8m0fnu)
        x = x / 64
    return x, q, s


def _ref(x, q, s, block):
    from deepinfer_core.kernels.ops.gemm import fp8_block

    return fp8_block(x, q, s, block).float()  # bf16 x: the reference rounds q * scale to bf16


@pytest.mark.parametrize("t", [1, 2, 5, 8, 9, 16])
@pytest.mark.parametrize("n,k", [(1280, 5120), (32768, 1280), (512, 5120), (5120, 8192), (64, 128), (2304, 5120)])
@pytest.mark.parametrize("block", [(32, 32), (128, 128)])
@pytest.mark.parametrize("knobs", [{}, {"programs": 64, "stages": 2}, {"programs": 1, "safe": True}])
def test_wgmma_gemv(t, n, k, block, knobs):
    from deepinfer_nvidia.kernels import gluon_fp8_gemv as gg

    if n > 5000 and t not in (1, 16) or knobs and n == 32768 and t != 1:  # keep the file's run short
        pytest.skip("covered by the other sizes")
    x, q, s = _operands(t, n, k, block, 7 * t + n + k)
    ref = _ref(x, q, s, block)
    poison()
    xc, qc, sc = x.cuda(), q.cuda(), s.view(torch.uint8).contiguous().cuda()
    assert gg.takes(xc, qc, block[0], block[1], True)
    out = gg.gemv_wgmma(xc, qc, sc, sc.shape[1], block[0], block[1], 132, **knobs)
    close(out, ref.bfloat16(), 2e-2, 2e-2)


@pytest.mark.parametrize("t", [1, 2, 9, 16])
@pytest.mark.parametrize("n,k", [(32768, 1280), (1280, 5120), (64, 128)])
@pytest.mark.parametrize("knobs", [{}, {"pdl": True}, {"safe": True, "programs": 1}])
def test_wgmma_gemv_swizzled_ring_is_bit_equal(t, n, k, knobs):
    """``GEMV_SWIZZLE``: the weight ring as [64, 128] rows with XOR-swizzled 16-byte chunks gives the unswizzled
    ring's bits (each thread decodes the same bytes), and the reference's values."""
    from deepinfer_nvidia.kernels import gluon_fp8_gemv as gg

    x, q, s = _operands(t, n, k, (32, 32), 11 * t + n)
    ref = _ref(x, q, s, (32, 32))
    poison()
    xc, qc, sc = x.cuda(), q.cuda(), s.view(torch.uint8).contiguous().cuda()
    out = gg.gemv_wgmma(xc, qc, sc, sc.shape[1], 32, 32, 132, swizzle=True, **knobs)
    close(out, ref.bfloat16(), 2e-2, 2e-2)
    assert torch.equal(out, gg.gemv_wgmma(xc, qc, sc, sc.shape[1], 32, 32, 132, swizzle=False, **knobs))


@pytest.mark.parametrize("t", [1, 3, 16])
@pytest.mark.parametrize("block", [(32, 32), (128, 128)])
def test_wgmma_gemv_extreme_scales_exact_decode(t, block):
    """Every finite e4m3 code with scale bytes 0..200: the weights must decode to exactly bf16(q * scale), so
    the error is the fp32 summation order (bounded by |x| @ |W|^T) plus the bf16 output rounding."""
    from deepinfer_nvidia.kernels import gluon_fp8_gemv as gg

    n, k = 256, 1024
    x, q, s = _operands(t, n, k, block, 99 + t, extreme=True)
    scale = s.float().repeat_interleave(block[0], 0)[:n].repeat_interleave(block[1], 1)[:, :k]
    w = (q.float() * scale).bfloat16().double()  # the reference's rounding, exact for UE8M0 scales
    ref = x.double() @ w.t()
    bound = x.double().abs() @ w.abs().t()
    poison()
    xc, qc, sc = x.cuda(), q.cuda(), s.view(torch.uint8).contiguous().cuda()
    assert not gg.scales_allow_fast(sc)
    out = gg.gemv_wgmma(xc, qc, sc, sc.shape[1], block[0], block[1], 132).double().cpu()
    assert torch.isfinite(out).all()
    err = (out - ref).abs()
    assert (err <= ref.abs() * 2 ** -8 + bound * 1e-5).all(), float((err / (bound + 1e-300)).max())


@pytest.mark.parametrize("t", [1, 8])
def test_wgmma_gemv_grouped_through_registry_and_graph_replay(t):
    """``gemm.fp8_block_grouped`` (provider triton) at the V4.1 ``wo_a`` width takes the wgmma GEMV; a CUDA
    graph of two launches replays to the same bits (the split-K arrival counters reset themselves)."""
    from deepinfer_core.kernels.ops.gemm import fp8_block_grouped
    from deepinfer_core.kernels.ops.quant import quant_fp8_block
    from deepinfer_core.kernels.registry import get_registry
    from deepinfer_core.kernels.resolve import ensure_platform_kernels
    from deepinfer_nvidia.platform import NvidiaPlatform

    reg = get_registry()
    ensure_platform_kernels(reg, NvidiaPlatform())
    fn = reg.impl("gemm.fp8_block_grouped", "triton")
    g = _gen(500 + t)
    groups, ng, kg = 8, 1024, 4096
    x = torch.randn(t, groups * kg, generator=g).bfloat16()
    q, s = quant_fp8_block(torch.randn(groups * ng, kg, generator=g) / kg ** 0.5, (32, 32), "ue8m0")
    ref = fp8_block_grouped(x, q, s, (32, 32), groups).float()
    xc, qc, sc = x.cuda(), q.cuda(), s.cuda()
    poison()
    out = fn(xc, qc, sc, (32, 32), groups)
    close(out, ref.bfloat16(), 2e-2, 2e-2)
    fn(xc, qc, sc, (32, 32), groups)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        a = fn(xc, qc, sc, (32, 32), groups)
        b = fn(xc, qc, sc, (32, 32), groups)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(a, out) and torch.equal(b, out)


@pytest.mark.parametrize("t", [1, 8, 16])
@pytest.mark.parametrize("split_programs", [4, 1])
@pytest.mark.parametrize("early", [False, True])
def test_wgmma_gemv_pdl_chain_eager_and_graphed(t, split_programs, early, monkeypatch):
    """Programmatic dependent launch (``_common.PDL``): RMSNorm releasing the next kernel at its start, then a
    chain of GEMVs where each reads the previous one's output (wq_a -> wq_b shapes, then a GEMV of a tensor an
    elementwise op just wrote) gives the bits of the plain launches, eagerly and replayed from a CUDA graph with
    fresh inputs each replay: the weight prologue that runs before ``griddepcontrol.wait`` never reads what the
    previous kernel writes. ``early``: each GEMV releases the next kernel right after its wait
    (``GEMV_EARLY_RELEASE``), so the next GEMV's prologue overlaps the whole K loop."""
    from deepinfer_nvidia.kernels import _common
    from deepinfer_nvidia.kernels import gluon_fp8_gemv as gg
    from deepinfer_nvidia.kernels.triton_norm import rms

    monkeypatch.setattr(gg, "GEMV_EARLY_RELEASE", early)

    x, q1, s1 = _operands(t, 1280, 5120, (32, 32), 901 + t)
    _, q2, s2 = _operands(t, 4096, 1280, (32, 32), 902 + t)
    _, q3, s3 = _operands(t, 1024, 4096, (32, 32), 903 + t)
    ws = [(q.cuda(), s.view(torch.uint8).contiguous().cuda()) for q, s in ((q1, s1), (q2, s2), (q3, s3))]
    norm_w = (torch.rand(5120, generator=_gen(904)) + 0.5).bfloat16().cuda()

    def chain(a, pdl):
        monkeypatch.setattr(_common, "PDL", int(pdl))
        h = rms(a, norm_w, 1e-6)
        h = gg.gemv_wgmma(h, *ws[0], ws[0][1].shape[1], 32, 32, 132, programs=split_programs)
        h = gg.gemv_wgmma(h, *ws[1], ws[1][1].shape[1], 32, 32, 132, programs=split_programs)
        h = h * 0.5 + 1.0  # a torch kernel between two PDL launches
        return gg.gemv_wgmma(h, *ws[2], ws[2][1].shape[1], 32, 32, 132, programs=split_programs)

    xc = x.cuda()
    poison()
    want = chain(xc, False)
    assert torch.isfinite(want.float()).all()
    assert torch.equal(chain(xc, True), want)
    static = xc.clone()
    chain(static, True)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain(static, True)
    for seed in range(3):
        fresh = torch.randn(t, 5120, generator=_gen(910 + seed)).bfloat16().cuda()
        static.copy_(fresh)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, chain(fresh, False)), seed


@pytest.mark.parametrize("t", [1, 8, 16])
@pytest.mark.parametrize("n,k", [(1280, 5120), (64, 128), (2304, 5120), (32768, 1280)])
@pytest.mark.parametrize("knobs", [{}, {"programs": 64, "stages": 2}, {"programs": 1, "stages": 6}])
def test_wgmma_gemv_tma(t, n, k, knobs):
    """Weight tiles by TMA (``tma=True``, ``GEMV_TMA``): the reference's values and the cp.async launch's bits (the
    same sums in the same order), with deep, no and uneven split-K and 2-6 stages; then one CUDA graph replayed with
    fresh inputs under PDL (the TMA prologue runs before ``griddepcontrol.wait``)."""
    from deepinfer_nvidia.kernels import gluon_fp8_gemv as gg

    if n == 32768 and t != 1:
        pytest.skip("covered by the other sizes")
    x, q, s = _operands(t, n, k, (128, 128), 3 * t + n + k)
    ref = _ref(x, q, s, (128, 128))
    xc, qc, sc = x.cuda(), q.cuda(), s.view(torch.uint8).contiguous().cuda()
    assert gg.tma_fits(qc.view(torch.uint8))
    poison()
    out = gg.gemv_wgmma(xc, qc, sc, sc.shape[1], 128, 128, 132, tma=True, **knobs)
    close(out, ref.bfloat16(), 2e-2, 2e-2)
    assert torch.equal(out, gg.gemv_wgmma(xc, qc, sc, sc.shape[1], 128, 128, 132, tma=False, **knobs))
    static = xc.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = gg.gemv_wgmma(static, qc, sc, sc.shape[1], 128, 128, 132, tma=True, pdl=True, **knobs)
    for seed in range(2):
        static.copy_(torch.randn(t, k, generator=_gen(950 + seed)).bfloat16().cuda())
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, gg.gemv_wgmma(static, qc, sc, sc.shape[1], 128, 128, 132, tma=False, **knobs)), seed


@pytest.mark.parametrize("t", [17, 24, 32])
@pytest.mark.parametrize("n,k", [(1280, 5120), (32768, 1280), (512, 5120), (64, 128), (2304, 5120)])
@pytest.mark.parametrize("block", [(32, 32), (128, 128)])
def test_wgmma_gemv_thirty_two_rows(t, n, k, block, monkeypatch):
    """``DEEPINFER_NV_WGMMA_GEMV_ROWS=32`` (prepared in the twenty-sixth pass): 17-32 rows with 32 activation rows
    as the wgmma's N, against the reference; and through the registry's ``gemm.fp8_block``."""
    from deepinfer_core.kernels.registry import get_registry
    from deepinfer_core.kernels.resolve import ensure_platform_kernels
    from deepinfer_nvidia.kernels import gluon_fp8_gemv as gg
    from deepinfer_nvidia.platform import NvidiaPlatform

    monkeypatch.setitem(gg.WGMMA_GEMV_TUNE, "max_rows", 32)
    x, q, s = _operands(t, n, k, block, 13 * t + n + k)
    ref = _ref(x, q, s, block)
    poison()
    xc, qc, sc = x.cuda(), q.cuda(), s.view(torch.uint8).contiguous().cuda()
    assert gg.takes(xc, qc, block[0], block[1], True)
    out = gg.gemv_wgmma(xc, qc, sc, sc.shape[1], block[0], block[1], 132)
    close(out, ref.bfloat16(), 2e-2, 2e-2)
    reg = get_registry()
    ensure_platform_kernels(reg, NvidiaPlatform())
    poison()
    out2 = reg.impl("gemm.fp8_block", "triton")(xc, qc, s.cuda(), block)
    assert torch.equal(out2, out)
