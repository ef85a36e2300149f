"""``mhc.head_pre``'s Triton launch (``deepinfer_nvidia/kernels/triton_mhc.py:head_pre``) in Triton's CPU interpreter
against the reference: the op's own cases and a V4-like width (n 4, D 1280: several K splits), and the reference's
shape errors."""
from __future__ import annotations


import pytest
import torch

_INTERPRETED = r"""
import torch
from deepinfer_core.kernels.ops.mhc import _gen_head, mhc_head_pre
from deepinfer_nvidia.kernels import triton_mhc as tm

n = 0
for seed in range(2):
    for args, _ in _gen_head(torch.float32, "cpu", seed):
        torch.testing.assert_close(tm.head_pre(*args, force_kernel=True), mhc_head_pre(*args), atol=1e-5, rtol=1e-5)
        n += 1
g = torch.Generator().manual_seed(3)
r = torch.randn(3, 4, 1280, generator=g)
fn = torch.randn(4, 5120, generator=g) * 0.02
base, scale = torch.randn(4, generator=g), torch.rand(1, generator=g)
torch.testing.assert_close(tm.head_pre(r, fn, base, scale, 1e-6, 1e-6, force_kernel=True),
                           mhc_head_pre(r, fn, base, scale, 1e-6, 1e-6), atol=1e-5, rtol=1e-5)
print("INTERPRETED", n + 1)
"""


def test_head_pre_in_the_interpreter(run_interpreted):
    run_interpreted(_INTERPRETED, "INTERPRETED 5")


def test_head_pre_shape_errors():
    pytest.importorskip("triton")
    from deepinfer_nvidia.kernels import triton_mhc as tm

    r = torch.randn(2, 4, 16)
    with pytest.raises(ValueError, match="expected fn"):
        tm.head_pre(r, torch.randn(4, 60), torch.randn(4), torch.rand(1), 1e-6, 1e-6, force_kernel=True)
