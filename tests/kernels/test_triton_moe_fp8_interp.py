"""The grouped FP8-expert kernels (``deepinfer_nvidia/kernels/triton_moe_fp8.py``) in Triton's CPU interpreter
against ``moe.experts_fp8``'s reference. fp32 activations only: the interpreter returns garbage for bf16 x bf16
``tl.dot`` (docs/performance.md, sixteenth pass), so the bf16 roundings are checked on the H200
(``deepinfer_nvidia/tests/test_conformance_moe_fp8.py``). Covered: fp32 and UE8M0 block scales, [128, 128] and
[32, 32] blocks, D and F that are not multiples of the K tile, 16- to 64-row blocks, a routing that puts every
pair on one expert, and batch invariance with the fixed ``BI_TILES``: a token's output bits do not depend on the
other tokens of the batch."""
from __future__ import annotations

_INTERPRETED = r"""
import torch
from deepinfer_core.kernels.ops.moe import experts_fp8
from deepinfer_core.kernels.ops.quant import QuantFormatError, quant_fp8_block
from deepinfer_nvidia.kernels import triton_moe_fp8 as m8

g = torch.Generator().manual_seed(0)
n = 0
for e, d, f, block, fmt in ((6, 160, 96, (128, 128), None), (5, 96, 80, (32, 32), "ue8m0"),
                            (4, 64, 48, (128, 128), "ue8m0")):
    def stack(rows, cols):
        q = [quant_fp8_block(torch.randn(rows, cols, generator=g) / cols ** 0.5, block, fmt) for _ in range(e)]
        return [torch.stack([a for a, _ in q]), torch.stack([b for _, b in q])]

    ws = stack(f, d) + stack(f, d) + stack(d, f)
    for t, k, route, bm in ((3, 2, "rand", None), (9, 3, "one", 16), (20, 4, "rand", 32), (20, 2, "rand", 64)):
        x = torch.randn(t, d, generator=g)
        ids = torch.full((t, k), e - 1, dtype=torch.long) if route == "one" else \
            torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
        w = torch.rand(t, k, generator=g)
        ref = experts_fp8(x, w, ids, *ws, block, 0.8)
        out = m8.grouped_fp8(x, w, ids, *ws, block, 0.8, block_m=bm, block_n=32)
        err = float((out - ref).abs().max() / ref.abs().max())
        assert out.shape == ref.shape and out.dtype == ref.dtype and err < 1e-5, (e, d, f, block, fmt, t, route, err)
        n += 1

    # batch invariance with the fixed tiles: token 0 alone, and among 11 others routed anywhere
    bm, bn, warps, stages, max_k = m8.BI_TILES
    x = torch.randn(12, d, generator=g)
    ids = torch.stack([torch.randperm(e, generator=g)[:2] for _ in range(12)])
    w = torch.rand(12, 2, generator=g)
    big = m8.grouped_fp8(x, w, ids, *ws, block, 0.8, block_m=bm, block_n=bn, max_k=max_k)
    one = m8.grouped_fp8(x[:1], w[:1], ids[:1], *ws, block, 0.8, block_m=bm, block_n=bn, max_k=max_k)
    assert torch.equal(big[:1], one), float((big[:1] - one).abs().max())
    n += 1

# the shared harness's own cases (16 x 16 blocks, F = 8 narrower than the 16-column K tile)
from deepinfer_core.kernels.ops.moe import _gen_experts_fp8
for args, _ in _gen_experts_fp8(torch.float32, "cpu", 0):
    ref = experts_fp8(*args)
    out = m8.grouped_fp8(*args)
    assert float((out - ref).abs().max() / ref.abs().max()) < 1e-5
    n += 1

try:  # a scale of the wrong shape is named
    m8.grouped_fp8(x, w, ids, ws[0], ws[1][:-1], *ws[2:], block, 0.8)
    raise AssertionError("a scale stack for fewer experts was taken")
except QuantFormatError as exc:
    assert "s1" in str(exc), exc
    n += 1
print("INTERPRETED", n)
"""


def test_grouped_fp8_experts_in_the_interpreter(run_interpreted):
    run_interpreted(_INTERPRETED, "INTERPRETED 18", timeout=600)
