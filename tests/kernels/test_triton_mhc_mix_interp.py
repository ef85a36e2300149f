"""``mhc.mix``'s Triton launch (``deepinfer_nvidia/kernels/triton_mhc.py:mix``) in Triton's CPU interpreter against
the reference at V4.1's width (n 4, D 5120): decode sizes with the ieee dot take 256 K splits, 160 of them with
one K tile and the rest empty (they must add zeros), in the default and the batch-invariant launch; and the
prefill launch's tiles and split (at 37 tokens, its threshold lowered to 16, and a narrower width) with its fp32
dot. Triton 3.9's interpreter returns garbage for any bf16 x bf16 ``tl.dot``, so the bf16-pieces products
(``DECODE_SPLIT_FN``, ``SPLIT_FN_BF16``) are turned off here and checked on the GPU
(``deepinfer_nvidia/tests/test_conformance.py::test_mhc_mix_model_width``, ``test_conformance_mhc_prefill.py``)."""
from __future__ import annotations

_INTERPRETED = r"""
import torch
from deepinfer_core.kernels.ops.mhc import mhc_mix
from deepinfer_nvidia.kernels import triton_mhc as tm

tm.DECODE_SPLIT_FN = False  # bf16 dots: see the docstring
g = torch.Generator().manual_seed(5)
n, d = 4, 5120
fn = torch.randn((2 + n) * n, n * d, generator=g) / (n * d) ** 0.5
base = torch.randn((2 + n) * n, generator=g)
scale = torch.rand(3, generator=g) + 0.5
cases = 0
for t in (1, 3):
    r = torch.randn(t, n, d, generator=g).bfloat16()
    ref = mhc_mix(r, fn, base, scale, 1e-6, 1e-6, 20)
    for bi in (False, True):
        out = tm.mix(r, fn, base, scale, 1e-6, 1e-6, 20, batch_invariant=bi, force_kernel=True)
        for o, rr in zip(out, ref):
            torch.testing.assert_close(o, rr, atol=1e-5, rtol=1e-5)
        cases += 1
# the prefill launch (>= TF32X3_MIN_T tokens) with its fp32 dot
tm.SPLIT_FN_BF16 = False
tm.TF32X3_MIN_T = 16  # the prefill launch at a size the interpreter runs quickly
n2, d2 = 4, 64
fn2 = torch.randn((2 + n2) * n2, n2 * d2, generator=g) / (n2 * d2) ** 0.5
base2 = torch.randn((2 + n2) * n2, generator=g)
t = 37
for dtype in (torch.bfloat16, torch.float32):
    r = torch.randn(t, n2, d2, generator=g).to(dtype)
    ref = mhc_mix(r, fn2, base2, scale, 1e-6, 1e-6, 20)
    out = tm.mix(r, fn2, base2, scale, 1e-6, 1e-6, 20, force_kernel=True, prefill_launch=(16, 64, 4, 1))
    for o, rr in zip(out, ref):
        torch.testing.assert_close(o, rr, atol=1e-5, rtol=1e-5)
    cases += 1
print("INTERPRETED", cases)
"""


def test_mix_in_the_interpreter(run_interpreted):
    run_interpreted(_INTERPRETED, "INTERPRETED 6")
