"""The delayed-mHC boundary's Triton launches in Triton's CPU interpreter against the references: ``mhc.expand``
(``triton_mhc.expand``) with the sublayer output as one tensor and as two parts (the MoE's routed and shared
outputs, summed in fp32 inside the kernel rather than by a separate add), and ``mhc.collapse_norm``
(``triton_mhc.collapse_norm``: the collapse and the input norm in one launch)."""
from __future__ import annotations

import pytest
import torch

_INTERPRETED = r"""
import torch
from deepinfer_core.kernels.ops.mhc import _gen_expand, mhc_expand
from deepinfer_nvidia.kernels import triton_mhc as tm

n = 0
for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 1e-2)):
    for seed in range(2):
        for args, _ in _gen_expand(dtype, "cpu", seed):
            torch.testing.assert_close(tm.expand(*args, force_kernel=True), mhc_expand(*args), atol=tol, rtol=tol)
            n += 1
# two bf16 parts are added in fp32 (an fp32 residual keeps the difference visible): the kernel matches the fp32 sum
# and not the sum rounded to bf16 first (what a separate bf16 add launch gave)
g = torch.Generator().manual_seed(5)
r = torch.randn(2, 4, 640, generator=g)
a, b = (torch.randn(2, 640, generator=g).bfloat16() for _ in range(2))
post, comb = 2 * torch.rand(2, 4, generator=g), torch.rand(2, 4, 4, generator=g)
got = tm.expand(r, (a, b), post, comb, force_kernel=True)
torch.testing.assert_close(got, mhc_expand(r, (a, b), post, comb), atol=1e-6, rtol=1e-6)
assert (got - mhc_expand(r, a + b, post, comb)).abs().max() > 1e-3
from deepinfer_core.kernels.ops.mhc import _gen_collapse_norm, mhc_collapse_norm
for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
    for seed in range(2):
        for args, _ in _gen_collapse_norm(dtype, "cpu", seed):
            torch.testing.assert_close(tm.collapse_norm(*args, force_kernel=True), mhc_collapse_norm(*args),
                                       atol=tol, rtol=tol)
            n += 1
print("INTERPRETED", n + 1)
"""


def test_expand_in_the_interpreter(run_interpreted):
    run_interpreted(_INTERPRETED, "INTERPRETED 33")


def test_expand_part_errors():
    pytest.importorskip("triton")
    from deepinfer_nvidia.kernels import triton_mhc as tm

    r, post, comb = torch.randn(2, 4, 16), torch.rand(2, 4), torch.rand(2, 4, 4)
    with pytest.raises(ValueError, match=r"expected y \[2, 16\]"):
        tm.expand(r, (torch.randn(2, 16), torch.randn(2, 8)), post, comb, force_kernel=True)


def test_collapse_norm_shape_errors():
    pytest.importorskip("triton")
    from deepinfer_nvidia.kernels import triton_mhc as tm

    r = torch.randn(2, 4, 16)
    with pytest.raises(ValueError, match=r"expected pre \[2, 4\] and norm_w \[16\]"):
        tm.collapse_norm(r, torch.rand(2, 4), torch.ones(8), 1e-6, force_kernel=True)
