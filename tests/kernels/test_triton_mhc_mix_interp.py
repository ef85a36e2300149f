"""``mhc.mix``'s Triton launch (``deepinfer_nvidia/kernels/triton_mhc.py:mix``) in Triton's CPU interpreter against
the reference at V4.1's width (n 4, D 5120): decode sizes take 256 K splits, 160 of them with one K tile and the
rest empty (they must add zeros), in the default and the batch-invariant launch."""
from __future__ import annotations

_INTERPRETED = r"""
import torch
from deepinfer_core.kernels.ops.mhc import mhc_mix
from deepinfer_nvidia.kernels import triton_mhc as tm

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
print("INTERPRETED", cases)
"""


def test_mix_in_the_interpreter(run_interpreted):
    run_interpreted(_INTERPRETED, "INTERPRETED 4")
