"""``moe.topk_experts_mxfp4`` on the GPU (SM90 with Gluon): at one token the route-and-layout launch
(``triton_route_align``) feeds the swap kernels, and the result equals the two ops' kernels in turn
(``gemm_dense_wide``, ``route_topk``, ``moe_experts_mxfp4``) bit for bit: both stack layouts, an fp32 and a bf16
router, 384 experts, a poisoned allocator, the knob off, and graph replays with fresh routings every replay."""
from __future__ import annotations

import pytest
import torch

from deepinfer_nvidia.tests.test_conformance import _gen, _mxfp4_stacks, poison


def _modules():
    from deepinfer_nvidia.kernels import gluon_moe_swap as sw
    from deepinfer_nvidia.kernels import mxfp4_layout, triton_route_align

    if not (torch.cuda.is_available() and sw.available() and torch.cuda.get_device_capability()[0] == 9):
        pytest.skip("the one-launch route feeds the Gluon swap kernels: SM90 with triton.experimental.gluon only")
    return mxfp4_layout, triton_route_align


def _random_stacks(e: int, d: int, f: int, seed: int) -> list[torch.Tensor]:
    """MXFP4 stacks (w1, s1, w3, s3, w2, s2) made on the GPU: random e2m1 byte pairs and UE8M0 scales 2^-4..2^-1
    (quantising V4.1-wide stacks on the host takes ~1 s a matrix, minutes for a layer)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    out = []
    for n, k in ((f, d), (f, d), (d, f)):
        out.append(torch.randint(0, 256, (e, n, k // 2), generator=g, device="cuda", dtype=torch.uint8))
        out.append(torch.randint(123, 127, (e, n, k // 32), generator=g, device="cuda", dtype=torch.uint8)
                   .view(torch.float8_e8m0fnu))
    return out


def _layer(e: int, d: int, f: int, words: bool, router: torch.dtype, seed: int):
    layout, _ = _modules()
    ws = _random_stacks(e, d, f, 700 + seed) if d * f > 1 << 20 else [a.cuda() for a in _mxfp4_stacks(e, d, f, 700)]
    if words:
        ws = list(layout.experts_mxfp4_layout(*ws))
        assert ws[0].dtype == torch.int32, "the word layout was not made on this device"
    g = _gen(seed)
    gate_w = (torch.randn(e, d, generator=g) / d ** 0.5).to(router).cuda()
    bias = (torch.randn(e, generator=g) * 0.1).cuda()
    return gate_w, bias, ws


def _parts(x, gate_w, bias, k, ws):
    from deepinfer_nvidia.kernels.triton_dense_gemv import gemm_dense_wide
    from deepinfer_nvidia.kernels.triton_moe import moe_experts_mxfp4
    from deepinfer_nvidia.kernels.triton_route import route_topk

    weights, ids = route_topk(gemm_dense_wide(x, gate_w), bias, k, 2.5)
    return moe_experts_mxfp4(x, weights, ids, *ws, 10.0)


@pytest.mark.parametrize("e,d,f,words,router", [(32, 5120, 2304, True, torch.float32),
                                                (32, 5120, 2304, False, torch.bfloat16),
                                                (384, 256, 128, True, torch.bfloat16),
                                                (16, 1024, 512, False, torch.float32)])
def test_one_launch_equals_the_parts(e, d, f, words, router):
    _, ra = _modules()
    gate_w, bias, ws = _layer(e, d, f, words, router, 3)
    for seed in range(4):
        x = torch.randn(1, d, generator=_gen(seed)).bfloat16().cuda()
        ref = _parts(x, gate_w, bias, 6, ws)
        poison()
        assert ra.one_launch_uncovered(x, torch.empty(1, e, device="cuda"), bias, 6, 2.5, ws[0]) is None
        out = ra.topk_experts_mxfp4(x, gate_w, bias, 6, 2.5, *ws, 10.0)
        assert torch.equal(out, ref), (seed, (out.float() - ref.float()).abs().max())


def test_more_tokens_and_the_knob_off_take_the_parts():
    _, ra = _modules()
    gate_w, bias, ws = _layer(32, 1024, 512, True, torch.float32, 4)
    x = torch.randn(5, 1024, generator=_gen(9)).bfloat16().cuda()
    assert ra.one_launch_uncovered(x, torch.empty(5, 32, device="cuda"), bias, 6, 2.5, ws[0]) is not None
    assert torch.equal(ra.topk_experts_mxfp4(x, gate_w, bias, 6, 2.5, *ws, 10.0), _parts(x, gate_w, bias, 6, ws))
    x1 = x[:1].contiguous()
    ra.ROUTE_ALIGN = False
    try:
        assert ra.one_launch_uncovered(x1, torch.empty(1, 32, device="cuda"), bias, 6, 2.5, ws[0]) is not None
        assert torch.equal(ra.topk_experts_mxfp4(x1, gate_w, bias, 6, 2.5, *ws, 10.0), _parts(x1, gate_w, bias, 6, ws))
    finally:
        ra.ROUTE_ALIGN = True


def test_graph_replays_route_afresh():
    """Captured once, replayed with new activations: each replay's routing (and so its layout) differs, and each
    equals the parts run eagerly on the same token."""
    _, ra = _modules()
    gate_w, bias, ws = _layer(64, 5120, 2304, True, torch.float32, 5)
    x = torch.randn(1, 5120, generator=_gen(20)).bfloat16().cuda()
    ra.topk_experts_mxfp4(x, gate_w, bias, 6, 2.5, *ws, 10.0)  # compile and warm outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ra.topk_experts_mxfp4(x, gate_w, bias, 6, 2.5, *ws, 10.0)
    seen = set()
    for seed in range(21, 27):
        x.copy_(torch.randn(1, 5120, generator=_gen(seed)).bfloat16().cuda())
        graph.replay()
        torch.cuda.synchronize()
        from deepinfer_nvidia.kernels.triton_route import route_topk
        from deepinfer_nvidia.kernels.triton_dense_gemv import gemm_dense_wide

        seen.add(tuple(sorted(route_topk(gemm_dense_wide(x, gate_w), bias, 6, 2.5)[1][0].tolist())))
        assert torch.equal(out, _parts(x, gate_w, bias, 6, ws)), seed
    assert len(seen) > 1, "every replay routed to the same experts: the test would not see a stale layout"
