"""The split-K GEMV MXFP4 expert kernels (``deepinfer_nvidia/kernels/triton_moe_splitk.py``: ``_up_gemv_kernel``,
``_act_kernel``, ``_down_gemv_kernel``, ``_finish_kernel``) in Triton's CPU interpreter against
``moe.experts_mxfp4``'s reference, through ``splitk_mxfp4`` (the public provider hands CPU tensors to the
reference). The interpreter cannot run inline PTX, so this is the plain-Triton nibble decode (``asm=0``); the
inline-PTX conversion is checked bit-for-bit against it in ``tests/kernels/test_gluon_swap_decode.py`` and on the
H200 (``test_moe_experts_mxfp4_splitk``).

Covered: 1 to 20 tokens, top-k 2 to 6, pairs in routing order (up to ``UNSORTED_PAIRS``) and sorted by expert,
a routing that puts every pair on one expert (each token's k slots too), D = 288 and F = 160 (9 and 5 MXFP4
groups: row tiles of 16 to 256 and group tiles of 1 to 8 with tails), one K split (the up kernel applies the
SwiGLU) and the deepest split (partials, ``_act_kernel``, uneven last splits, 3 splits of the up product),
the module's default tiles. No ``tl.dot`` here, so all three activation dtypes run: fp32 and fp16 within 1e-5 and
2e-3 of the output's largest magnitude; bf16 within 3e-2, because the interpreter rounds fp32 -> bf16 toward
zero (the reference rounds to nearest), an error of up to one bf16 unit per rounding."""
from __future__ import annotations

_INTERPRETED = r"""
import torch
from tests.kernels.moe_cases import mxfp4_experts, routing
from deepinfer_core.kernels.ops.moe import experts_mxfp4
from deepinfer_nvidia.kernels import triton_moe_splitk as sk

g = torch.Generator().manual_seed(0)
e, d, f = 6, 288, 160


ws = mxfp4_experts(g, e, d, f)
tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 3e-2}
deep = 1 << 20  # programs to aim for: forces the deepest K split
n = 0
for dtype, t, k, route, bn, groups, programs, splits in (
        (torch.float32, 1, 6, "rand", 256, 1, deep, (3, 2)),
        (torch.float32, 1, 2, "rand", None, None, None, (1, 1)),  # SPLITK_TUNE's tiles
        (torch.float16, 3, 2, "one", 64, 2, deep, (2, 1)),
        (torch.bfloat16, 2, 4, "rand", 128, 4, 1, (1, 1)),
        (torch.float32, 20, 2, "rand", 256, 8, 1, (1, 1)),
        (torch.float16, 9, 2, "one", 256, 8, deep, (1, 1)),
        (torch.bfloat16, 4, 6, "rand", 256, 8, 1, (1, 1))):
    x = torch.randn(t, d, generator=g).to(dtype)
    ids = routing(g, t, k, e, route)
    w = torch.rand(t, k, generator=g)
    tune = sk.SPLITK_TUNE
    plan = [sk.split_for(t * k, nn, kk // 32, bn or tune["block_n"], groups or tune["groups"],
                         programs or tune["programs"])[0] for nn, kk in ((f, d), (d, f))]
    assert tuple(plan) == splits, (t, k, plan)  # the case runs the split counts it is meant to
    ref = experts_mxfp4(x, w, ids, *ws, 1.0)  # limit 1.0: the clamps are active
    out = sk.splitk_mxfp4(x, w, ids, *ws, 1.0, block_n=bn, groups=groups, programs=programs, asm=0)
    err = float((out.float() - ref.float()).abs().max() / ref.float().abs().max())
    assert out.shape == ref.shape and out.dtype == dtype and err < tol[dtype], (dtype, t, k, route, bn, groups, err)
    n += 1
print("INTERPRETED", n)
"""


def test_splitk_experts_in_the_interpreter(run_interpreted):
    run_interpreted(_INTERPRETED, "INTERPRETED 7", timeout=600)
