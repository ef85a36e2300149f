"""The ``tl.dot_scaled`` MXFP4 expert path (``deepinfer_nvidia/kernels/triton_moe_scaled.py``) in Triton's CPU
interpreter against ``moe.experts_mxfp4``'s reference: 16- to 64-row blocks, a routing that puts every pair on one
expert, K tiles with tails. The interpreter rounds bf16 differently from a GPU (the ninth pass found it mishandles
bf16 casts), so the bound here is loose (5% of the output norm): it catches layout, scale and routing bugs, which
give errors of order 100%; the GPU conformance test (``test_moe_experts_mxfp4_scaled``) holds the 3e-2 elementwise
bound."""
from __future__ import annotations


_INTERPRETED = r"""
import torch
from deepinfer_core.kernels.ops.moe import experts_mxfp4
from deepinfer_core.kernels.ops.quant import quant_mxfp4
from deepinfer_nvidia.kernels import triton_moe_scaled as sc

g = torch.Generator().manual_seed(0)
e, d, f = 8, 160, 96


def stack(n, kk):
    q = [quant_mxfp4(torch.randn(n, kk, generator=g) / kk ** 0.5) for _ in range(e)]
    return [torch.stack([a for a, _ in q]), torch.stack([b for _, b in q])]


ws = stack(f, d) + stack(f, d) + stack(d, f)
n = 0
for t, k, route, bm, bk in ((3, 2, "rand", 16, 64), (9, 3, "one", 16, 128), (20, 4, "rand", 32, 64),
                            (20, 4, "rand", 64, 256)):
    x = torch.randn(t, d, generator=g).bfloat16()
    if route == "one":
        ids = torch.full((t, k), e - 1, dtype=torch.long)
    else:
        ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
    w = torch.rand(t, k, generator=g)
    ref = experts_mxfp4(x, w, ids, *ws, 1.0).float()
    out = sc.scaled_mxfp4(x, w, ids, *ws, 1.0, block_m=bm, block_n=32, block_k=bk).float()
    rel = float((out - ref).norm() / ref.norm())
    assert out.shape == ref.shape and rel < 5e-2, (t, route, bm, bk, rel)
    n += 1
print("INTERPRETED", n)
"""


def test_scaled_experts_in_the_interpreter(run_interpreted):
    run_interpreted(_INTERPRETED, "INTERPRETED 4")
