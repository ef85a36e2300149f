"""The grouped MXFP4 expert kernels (``deepinfer_nvidia/kernels/triton_moe.py``: ``_moe_up_kernel`` and
``_moe_down_kernel`` after ``align``, then ``sum_slices``) in Triton's CPU interpreter against
``moe.experts_mxfp4``'s reference, through ``grouped_mxfp4`` (the public provider hands CPU tensors to the
reference).

Covered: both weight decodes (``INT_DECODE`` 0: fp16 bits and an fp32 multiply; 1: bf16 bits from integer ops) and
the ``TUNE`` default, 1 to 20 tokens, top-k 2 to 6, 16- to 64-row blocks and ``block_m_for``'s choice, a routing
that puts every pair on one expert (each token's k slots too; the expert then fills several blocks), D = 160 / 288
and F = 96 / 224 (K tiles with tails, and row tiles of 32 to 128 with tails), the shared harness's case, batch
invariance with the fixed ``BI_TILES`` (a token's output bits do not depend on the other tokens of the batch), and
a scale stack of the wrong shape named.

fp32 and fp16 activations, within 1e-5 and 2e-3 of the output's largest magnitude: the interpreter returns
garbage for bf16 x bf16 ``tl.dot`` (it multiplies the raw uint16 bits; docs/performance_pass_16.md), so the bf16
roundings are checked on the H200 (``test_moe_experts_mxfp4_grouped``); fp16 products are exact there and its
fp32 -> fp16 casts round to nearest like torch's, so fp16 checks the reference's roundings to x.dtype."""
from __future__ import annotations

_INTERPRETED = r"""
import torch
from tests.kernels.moe_cases import mxfp4_experts, routing
from deepinfer_core.kernels.ops.moe import _gen_experts_mxfp4, experts_mxfp4
from deepinfer_core.kernels.ops.quant import QuantFormatError
from deepinfer_nvidia.kernels import triton_moe as tm

g = torch.Generator().manual_seed(0)
tol = {torch.float32: 1e-5, torch.float16: 2e-3}
f32, f16 = torch.float32, torch.float16
n = 0
for e, d, f, cases in (
        (6, 160, 96, ((f32, 1, 6, "rand", 16, 64, 0), (f32, 3, 2, "rand", 16, 32, 1), (f16, 9, 3, "one", 16, 64, 0),
                      (f32, 20, 4, "rand", 32, 64, 1), (f16, 20, 5, "rand", 64, 32, None),
                      (f32, 20, 6, "one", None, None, None))),
        (4, 288, 224, ((f32, 2, 4, "rand", 16, 128, 1), (f16, 20, 3, "one", 32, 128, 0),
                       (f32, 17, 2, "rand", 64, 64, 1)))):
    ws = mxfp4_experts(g, e, d, f)
    for dtype, t, k, route, bm, bn, idec in cases:
        x = torch.randn(t, d, generator=g).to(dtype)
        ids = routing(g, t, k, e, route)
        w = torch.rand(t, k, generator=g)
        ref = experts_mxfp4(x, w, ids, *ws, 1.0)  # limit 1.0: the clamps are active
        out = tm.grouped_mxfp4(x, w, ids, *ws, 1.0, block_m=bm, block_n=bn, int_decode=idec)
        err = float((out.float() - ref.float()).abs().max() / ref.float().abs().max())
        assert out.shape == ref.shape and out.dtype == dtype and err < tol[dtype], (d, f, dtype, t, k, route, bm, err)
        n += 1

    # batch invariance with the fixed tiles: token 0 alone, and among 11 others routed anywhere
    bm, bn, warps, stages, idec = tm.BI_TILES
    x = torch.randn(12, d, generator=g)
    ids = torch.stack([torch.randperm(e, generator=g)[:3] for _ in range(12)])
    w = torch.rand(12, 3, generator=g)
    big = tm.grouped_mxfp4(x, w, ids, *ws, 1.0, block_m=bm, block_n=bn, int_decode=idec)
    one = tm.grouped_mxfp4(x[:1], w[:1], ids[:1], *ws, 1.0, block_m=bm, block_n=bn, int_decode=idec)
    assert torch.equal(big[:1], one), float((big[:1] - one).abs().max())
    n += 1

# the shared harness's case (D = 64, F = 32: one K tile, narrower than the 64-column row tile)
for args, _ in _gen_experts_mxfp4(torch.float32, "cpu", 0):
    if args[3].dtype != torch.uint8:
        continue  # the word-layout case: the public provider unpacks it before this path
    ref = experts_mxfp4(*args)
    out = tm.grouped_mxfp4(*args)
    assert float((out - ref).abs().max() / ref.abs().max()) < 1e-5
    n += 1

try:  # a scale stack for fewer experts is named
    tm.grouped_mxfp4(x, w, ids, ws[0], ws[1][:-1], *ws[2:], 1.0)
    raise AssertionError("a scale stack for fewer experts was taken")
except QuantFormatError as exc:
    assert "w1 must be" in str(exc), exc
    n += 1
print("INTERPRETED", n)
"""


def test_grouped_mxfp4_experts_in_the_interpreter(run_interpreted):
    run_interpreted(_INTERPRETED, "INTERPRETED 13")
