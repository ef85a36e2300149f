"""The ``mhc.mix`` projection's prefill and decode launches (``fn`` in three bf16 pieces for a bf16 residual,
tf32x3 or ieee for fp32) on the GPU against the float64 reference (skipped without one). Outputs start as NaN
(poisoned allocator), so an element a tile forgot to write fails."""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")


def _poison() -> None:
    torch.cuda.synchronize()
    blobs = [torch.full((64 << 20,), float("nan"), device="cuda") for _ in range(4)]
    del blobs
    torch.cuda.synchronize()


@pytest.mark.parametrize("t", [1024, 1031, 8192])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_mix_prefill_launch_against_reference(t, dtype):
    from deepinfer_core.kernels.ops.mhc import mhc_mix
    from deepinfer_nvidia.kernels import triton_mhc as tm

    g = torch.Generator(device="cuda").manual_seed(t)
    n, d = 4, 5120
    r = torch.randn(t, n, d, generator=g, device="cuda").to(dtype)
    fn = torch.randn((2 + n) * n, n * d, generator=g, device="cuda") / (n * d) ** 0.5
    base = torch.randn((2 + n) * n, generator=g, device="cuda")
    scale = torch.rand(3, generator=g, device="cuda") + 0.5
    ref = mhc_mix(r.double(), fn.double(), base.double(), scale.double(), 1e-6, 1e-6, 20)
    _poison()
    out = tm.mix(r, fn, base, scale, 1e-6, 1e-6, 20)
    for o, rr in zip(out, ref):
        assert not torch.isnan(o).any()
        torch.testing.assert_close(o.double(), rr, atol=4e-6, rtol=4e-6)


@pytest.mark.parametrize("t", [1, 8, 31, 64, 200])
@pytest.mark.parametrize("split_fn", [False, True])
def test_mix_decode_launch_against_reference(t, split_fn):
    """The decode-sized launch (below ``TF32X3_MIN_T``) with and without ``DECODE_SPLIT_FN``'s bf16-pieces
    product (at most ``DECODE_MAX_SPLITS`` K splits, ``DECODE_GATE_WARPS`` gate warps): the same bound as the
    prefill launch, against the float64 reference, at V4.1 width."""
    from deepinfer_core.kernels.ops.mhc import mhc_mix
    from deepinfer_nvidia.kernels import triton_mhc as tm

    g = torch.Generator(device="cuda").manual_seed(1000 + t)
    n, d = 4, 5120
    r = torch.randn(t, n, d, generator=g, device="cuda").bfloat16()
    fn = torch.randn((2 + n) * n, n * d, generator=g, device="cuda") / (n * d) ** 0.5
    base = torch.randn((2 + n) * n, generator=g, device="cuda")
    scale = torch.rand(3, generator=g, device="cuda") + 0.5
    ref = mhc_mix(r.double(), fn.double(), base.double(), scale.double(), 1e-6, 1e-6, 20)
    _poison()
    out = tm.mix(r, fn, base, scale, 1e-6, 1e-6, 20, decode_launch={"split_fn": split_fn})
    for o, rr in zip(out, ref):
        assert not torch.isnan(o).any()
        torch.testing.assert_close(o.double(), rr, atol=4e-6, rtol=4e-6)
