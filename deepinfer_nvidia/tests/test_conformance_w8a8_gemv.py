"""The MXFP8-activation FP8 ``wgmma`` GEMV (``gluon_w8a8_gemv``, opt-in, 1-16 rows on SM90) against its pure-torch
model ``w8a8_reference`` on the GPU (skipped without an SM90 device): V4.1 widths, row-tile tails, [32, 32] and
[128, 128] UE8M0 weight blocks, split-K and none, the grouped op at the ``wo_a`` width, activations over 24 binades
(every row's 32-column blocks get their own code) and all-zero rows, under PDL and without, and graph replay of
the split-K fold. Outputs are poisoned with NaN first. The kernel is deterministic: two launches are bit-equal."""
from __future__ import annotations

import pytest
import torch

from deepinfer_nvidia.tests.test_conformance import _gen, close, poison

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                                reason="needs an SM90 GPU")


def _operands(t, n, k, block, seed, wide=False):
    from deepinfer_core.kernels.ops.quant import quant_fp8_block

    g = _gen(seed)
    x = torch.randn(t, k, generator=g)
    if wide:  # magnitudes 2^-12 .. 2^12 across the row, one row of zeros
        x = x * torch.exp2(torch.linspace(-12, 12, k)).roll(int(seed) % k)
        x[t // 2] = 0
    q, s = quant_fp8_block(torch.randn(n, k, generator=g) / k ** 0.5, block, "ue8m0")
    return x.bfloat16(), q, s


def _close(out, ref):
    """Within 1% (and 0.5% of the largest output): the tensor core sums each 32-column block's FP8 products with
    fewer bits than fp32 (~2^-14 of the block's largest product), so an output that cancels to near zero may be
    off by that much of the others' scale."""
    close(out, ref.bfloat16(), 5e-3 * ref.abs().max().item() + 1e-3, 1e-2)


def _run(x, q, s, block, **kw):
    from deepinfer_nvidia.kernels import gluon_w8a8_gemv as gw

    xc, qc, sc = x.cuda(), q.cuda(), s.view(torch.uint8).contiguous().cuda()
    return gw.gemv_w8a8(xc, qc, sc, sc.shape[1], block[0], block[1], torch.cuda.get_device_properties(0)
                        .multi_processor_count, **kw)


@pytest.mark.parametrize("t", [1, 2, 5, 8, 9, 16])
@pytest.mark.parametrize("n,k", [(1792, 5120), (36864, 1280), (512, 5120), (5120, 8192), (64, 128), (4608, 5120),
                                 (5120, 2304)])
@pytest.mark.parametrize("block", [(32, 32), (128, 128)])
@pytest.mark.parametrize("knobs", [{}, {"programs": 64, "xloop": True}, {"programs": 1, "pdl": True},
                                   {"xloop": True, "stages": 3, "pdl": True}])
def test_w8a8_gemv(t, n, k, block, knobs):
    from deepinfer_nvidia.kernels.gluon_w8a8_gemv import w8a8_reference

    if n > 5000 and t not in (1, 16) or knobs and n == 36864 and t != 1:  # keep the file's run short
        pytest.skip("covered by the other sizes")
    x, q, s = _operands(t, n, k, block, 7 * t + n + k)
    ref = w8a8_reference(x, q, s, *block)
    poison()
    out = _run(x, q, s, block, **knobs)
    _close(out, ref)
    assert torch.equal(out, _run(x, q, s, block, **knobs))  # deterministic


@pytest.mark.parametrize("t", [1, 3, 16])
@pytest.mark.parametrize("block", [(32, 32), (128, 128)])
def test_w8a8_gemv_wide_activations(t, block):
    from deepinfer_nvidia.kernels.gluon_w8a8_gemv import w8a8_reference

    x, q, s = _operands(t, 1280, 5120, block, 11 + t, wide=True)
    ref = w8a8_reference(x, q, s, *block)
    poison()
    for xloop in (False, True):
        out = _run(x, q, s, block, xloop=xloop)
        _close(out, ref)
        assert not out[t // 2].any()  # the zero row


@pytest.mark.parametrize("t", [1, 8])
def test_w8a8_gemv_grouped_through_registry_and_graph_replay(t, monkeypatch):
    from deepinfer_core.kernels.ops.quant import quant_fp8_block
    from deepinfer_nvidia.kernels import gluon_w8a8_gemv as gw, triton_gemm as tg
    from deepinfer_nvidia.kernels.gluon_w8a8_gemv import w8a8_reference

    monkeypatch.setattr(gw, "ENABLED", True)
    g = _gen(5 + t)
    groups, ng, kg = 8, 1024, 512  # wo_a: 8 groups of [1024, 512]
    q, s = quant_fp8_block(torch.randn(groups * ng, kg, generator=g) / kg ** 0.5, (32, 32), "ue8m0")
    x = torch.randn(t, groups * kg, generator=g).bfloat16()
    ref = torch.cat([w8a8_reference(x[:, i * kg:(i + 1) * kg], q[i * ng:(i + 1) * ng], s[i * ng // 32:(i + 1) * ng // 32],
                                    32, 32) for i in range(groups)], dim=1)
    xc, qc, sc = x.cuda(), q.cuda(), s.cuda()
    out = tg.gemm_fp8_block_grouped(xc, qc, sc, (32, 32), groups)
    _close(out, ref)
    # a split-K shape in a CUDA graph: the arrival counters must be back at zero after each replay
    xb = torch.randn(t, 5120, generator=g).bfloat16().cuda()
    qb, sb = (v.cuda() for v in quant_fp8_block(torch.randn(1792, 5120, generator=g) / 72, (32, 32), "ue8m0"))
    tg.gemm_fp8_block(xb, qb, sb, (32, 32))
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            yb = tg.gemm_fp8_block(xb, qb, sb, (32, 32))
    torch.cuda.synchronize()
    for _ in range(3):
        xb.copy_(torch.randn(t, 5120, generator=g).bfloat16())
        graph.replay()
        torch.cuda.synchronize()
        _close(yb, w8a8_reference(xb.cpu(), qb.cpu(), sb.cpu(), 32, 32))
