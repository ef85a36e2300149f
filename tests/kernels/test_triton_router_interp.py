"""``moe.router_topk``'s one-launch kernel (``triton_router.fused_router_topk``: the router GEMV, the tiles' scores
and keys, the last tile's top-k) in Triton's CPU interpreter: bit-equal to its two-launch composition (the
``triton_dense_gemv`` GEMV widening x, then ``triton_route.route_topk``) at V4.1's router width and at small ones,
1 to 4 rows, with and without a K split, an fp32 router and a bf16 one (as the checkpoint stores it, widened in the
kernel), ties, and the arrival counters left at zero for the next launch (a CUDA graph replays it); the wrapper's
hand-off of host operands to the reference."""
from __future__ import annotations

import pytest
import torch

_INTERPRETED = r"""
import warnings
warnings.filterwarnings("ignore")  # numpy's notes on inf / NaN lanes the kernels mask out
import torch
from deepinfer_core.kernels.ops.moe import _compare_route, route_topk as ref_route
from deepinfer_nvidia.kernels import triton_dense_gemv as dg, triton_router as tr, triton_route as trt
from deepinfer_nvidia.kernels.triton_fp8_gemv import _counters

def parts(x, w, b, k, sc, sms):
    logits = dg.gemv(x, w, sms, widen=x.dtype != torch.float32)
    return trt.route_topk(logits, b, k, sc, force_kernel=True), logits

g = torch.Generator().manual_seed(3)
n = 0
for m, e, d, k, sms, dtype in ((1, 384, 5120, 6, 132, torch.bfloat16), (3, 384, 5120, 6, 132, torch.float32),
                               (4, 100, 96, 8, 8, torch.float16), (2, 24, 512, 3, 1, torch.bfloat16),
                               (1, 257, 1024, 32, 16, torch.float32)):
    x = torch.randn(m, d, generator=g).to(dtype)
    w = torch.randn(e, d, generator=g) / d ** 0.5
    b = torch.randn(e, generator=g) * 0.1
    split = dg.plan(m, e, d, sms)[2]
    (wp, ip), logits = parts(x, w, b, k, 2.5, sms)
    wf, idf = tr.fused_router_topk(x, w, b, k, 2.5, sms)
    assert torch.equal(idf, ip) and torch.equal(wf, wp), (m, e, d, k, split)
    _compare_route((wf, idf), ref_route(logits, b, k, 2.5), torch.float32)
    assert not _counters(x.device, 64)[:64].any()  # every arrival counter reset
    # the router as a checkpoint stores it (bf16), widened in the kernel: the logits of its fp32 copy, bit for bit
    wh = w.bfloat16()
    (wp, ip), _ = parts(x, wh.float(), b, k, 2.5, sms)
    wf, idf = tr.fused_router_topk(x, wh, b, k, 2.5, sms)
    assert torch.equal(idf, ip) and torch.equal(wf, wp), ("bf16 router", m, e, d, k, split)
    half = dg.gemv(x, wh, sms, widen=True, out_dtype=torch.float32)
    full = dg.gemv(x, wh.float(), sms, widen=x.dtype != torch.float32)
    assert half.dtype == torch.float32 and torch.equal(half, full)
    n += 1
# ties: equal logits on every expert (x zero) go to the lowest ids, as in the two launches
x = torch.zeros(1, 256)
w, b = torch.randn(40, 256, generator=g), torch.zeros(40)
wf, idf = tr.fused_router_topk(x, w, b, 6, 1.0, 4)
assert idf.tolist() == [[0, 1, 2, 3, 4, 5]] and torch.allclose(wf, torch.full((1, 6), 1 / 6)), (idf, wf)
n += 1
print("INTERPRETED", n)
"""


def test_fused_router_in_the_interpreter(run_interpreted):
    run_interpreted(_INTERPRETED, "INTERPRETED 6")


def test_router_hands_host_operands_to_the_reference():
    pytest.importorskip("triton")
    from deepinfer_core.kernels.ops.gemm import dense_wide
    from deepinfer_core.kernels.ops.moe import route_topk
    from deepinfer_nvidia.kernels import triton_router as tr

    g = torch.Generator().manual_seed(4)
    x, w, b = torch.randn(2, 64, generator=g).bfloat16(), torch.randn(24, 64, generator=g), torch.zeros(24)
    got, want = tr.router_topk(x, w, b, 4, 1.5), route_topk(dense_wide(x, w), b, 4, 1.5)
    assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0])
    wh = w.bfloat16()  # a bf16 router: the fp32 logits of its widened values
    got, want = tr.router_topk(x, wh, b, 4, 1.5), route_topk(dense_wide(x, wh.float()), b, 4, 1.5)
    assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0])
    with pytest.raises(ValueError, match="gemm.dense_wide"):
        tr.router_topk(x, torch.randn(24, 32), b, 4, 1.5)


def test_fused_takes():
    pytest.importorskip("triton")
    from deepinfer_nvidia.kernels import triton_router as tr

    x, w, b = torch.randn(1, 64).bfloat16(), torch.randn(384, 64), torch.zeros(384)
    assert tr.fused_takes(x, w, b, 6, 1.0) and tr.fused_takes(x, w.bfloat16(), b, 6, 1.0)  # fp32, or as stored
    assert not tr.fused_takes(torch.randn(5, 64).bfloat16(), w, b, 6, 1.0)  # more rows than the GEMV serves
    assert not tr.fused_takes(x, w, b, 33, 1.0)  # k past the routing kernel's
    assert not tr.fused_takes(x, w, b[:10], 6, 1.0)  # a bias of another width
