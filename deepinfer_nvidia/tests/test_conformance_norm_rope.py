"""``norm.rms_rope`` (``triton_rope.rms_rope``: RMSNorm and the tail rotation in one launch) on the GPU (skipped
without one), switched on (``RMS_ROPE_FUSED``) and off (its parts):

- the shared harness on the op's generated cases;
- V4.1's widths (a KV row of 512 with a 64-channel rope, an index key of 128), 1-300 tokens, positions up to
  2^31 - 1, against the reference on the CPU, outputs poisoned with NaN first;
- batch invariance: a row alone equals that row in a batch of 37, bit for bit;
- the fused kernel against the parts (the same fp32 ops; the sum of squares may reduce in another order).
"""
from __future__ import annotations

import pytest
import torch

from deepinfer_nvidia.tests.device_helpers import poison_allocator

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")


@pytest.fixture(params=[True, False], ids=["fused", "parts"])
def fused(request, monkeypatch):
    from deepinfer_nvidia.kernels import triton_rope

    monkeypatch.setattr(triton_rope, "RMS_ROPE_FUSED", request.param)
    return request.param


def _case(t: int, d: int, rd: int, dtype, seed: int):
    from deepinfer_core.kernels.ops.rope import default_inv_freq

    g = torch.Generator(device="cuda").manual_seed(seed)
    x = (3 * torch.randn(t, d, generator=g, device="cuda")).to(dtype)
    w = 1 + 0.1 * torch.randn(d, generator=g, device="cuda")
    pos = torch.randint(0, 2 ** 31 - 1, (t,), generator=g, device="cuda")
    return x, w, pos, default_inv_freq(rd, 10000.0).cuda()


def test_harness(nvidia_reg, fused):
    from deepinfer_core.testing.conformance import check_impl

    assert check_impl("norm.rms_rope", "triton", "cuda", seeds=(0, 1, 2), registry=nvidia_reg) > 0


@pytest.mark.parametrize("t", [1, 8, 64, 300])
@pytest.mark.parametrize("d,rd", [(512, 64), (128, 64)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_model_widths(nvidia_reg, fused, t, d, rd, dtype):
    from deepinfer_core.kernels.ops.norm import rms_rope

    x, w, pos, f = _case(t, d, rd, dtype, t + d)
    poison_allocator()
    out = nvidia_reg.impl("norm.rms_rope", "triton")(x, w, 1e-6, pos, f)
    ref = rms_rope(x.cpu(), w.cpu(), 1e-6, pos.cpu(), f.cpu())
    assert not torch.isnan(out).any()
    tol = 3e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(out.cpu(), ref, atol=tol, rtol=tol)


def test_rows_are_batch_invariant(nvidia_reg, fused):
    x, w, pos, f = _case(37, 512, 64, torch.bfloat16, 5)
    fn = nvidia_reg.impl("norm.rms_rope", "triton")
    big = fn(x, w, 1e-6, pos, f)
    for row in (0, 13, 36):
        assert torch.equal(fn(x[row:row + 1], w, 1e-6, pos[row:row + 1], f), big[row:row + 1]), row


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-6), (torch.bfloat16, 1e-2)])
def test_fused_matches_the_parts(monkeypatch, dtype, tol):
    """The same fp32 ops; only the sum of squares may reduce in another order (one rounding of the scale)."""
    from deepinfer_nvidia.kernels import triton_rope

    x, w, pos, f = _case(64, 512, 64, dtype, 9)
    monkeypatch.setattr(triton_rope, "RMS_ROPE_FUSED", True)
    fused_out = triton_rope.rms_rope(x, w, 1e-6, pos, f)
    monkeypatch.setattr(triton_rope, "RMS_ROPE_FUSED", False)
    torch.testing.assert_close(fused_out, triton_rope.rms_rope(x, w, 1e-6, pos, f), atol=tol, rtol=tol)
