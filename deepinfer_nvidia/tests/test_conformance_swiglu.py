"""``moe.clamped_swiglu`` (``triton_swiglu.py``, the shared expert's activation) against its reference on the GPU
(skipped without one).

    python3 -m pytest -q deepinfer_nvidia/tests/test_conformance_swiglu.py

Shapes of the shared expert (F = 2048 in V4-Flash, 2304 in V4.1-Flash; 1..8192 tokens) and small odd widths;
gate and up contiguous or the two column halves of one merged ``w1 | w3`` product; bf16 and fp32. Each launch runs
on a NaN-poisoned allocator with host synchronisation raising. Against the reference evaluated in float64 and
rounded as it rounds (silu to the dtype, then the product): within 2 units in the last place (an fp32 exp
may round the silu to the neighbouring bf16); a token alone equals the same token in a batch, bit for bit (the
registration says batch-invariant); a CUDA graph replay under programmatic dependent launch, with fresh inputs,
equals the eager launch.
"""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")


def _inputs(t: int, f: int, dtype: torch.dtype, merged: bool, seed: int):
    g = torch.Generator().manual_seed(seed)
    both = (8 * torch.randn(t, 2 * f, generator=g)).to(dtype).cuda()
    gate, up = both[:, :f], both[:, f:]
    return (gate, up) if merged else (gate.contiguous(), up.contiguous())


def _exact(gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
    """The reference's arithmetic with the silu in float64 (the kernel's own exp may differ from torch's by an
    fp32 ulp before the rounding to the dtype)."""
    gc = gate.double().clamp(max=limit)
    act = (gc / (1 + torch.exp(-gc))).to(gate.dtype)
    return (act.double() * up.double().clamp(-limit, limit)).to(gate.dtype)


def _launch(gate, up, limit):
    from deepinfer_nvidia.kernels.triton_swiglu import clamped_swiglu
    from deepinfer_nvidia.tests.test_conformance import poison

    poison()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = clamped_swiglu(gate, up, limit)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("merged", [True, False])
@pytest.mark.parametrize("t,f", [(1, 2304), (7, 2048), (64, 2304), (8192, 2304), (3, 96), (2, 1)])
def test_clamped_swiglu_matches_the_reference(dtype, merged, t, f):
    from deepinfer_core.kernels.ops.moe import clamped_swiglu as reference

    gate, up = _inputs(t, f, dtype, merged, seed=t * 31 + f)
    out = _launch(gate, up, 10.0)
    assert out.dtype == dtype and out.shape == (t, f) and out.is_contiguous()
    want = _exact(gate, up, 10.0)
    ulp = torch.finfo(dtype).eps * want.double().abs().clamp(min=torch.finfo(dtype).tiny)
    err = (out.double() - want.double()).abs()
    assert bool((err <= 2 * ulp + 1e-30).all()), err.max()
    torch.testing.assert_close(out, reference(gate, up, 10.0), **({"atol": 2e-2, "rtol": 2e-2}
                                                                 if dtype == torch.bfloat16 else {}))


def test_rows_are_batch_invariant_and_graphs_replay():
    """A token alone equals the token inside 64 (bit for bit); one graph captured under PDL, replayed with fresh
    merged inputs, equals the eager launch each time."""
    from deepinfer_nvidia.kernels import _common
    from deepinfer_nvidia.kernels.triton_swiglu import clamped_swiglu

    gate, up = _inputs(64, 2048, torch.bfloat16, True, seed=5)
    batch = _launch(gate, up, 10.0)
    for row in (0, 17, 63):
        assert torch.equal(_launch(gate[row:row + 1], up[row:row + 1], 10.0)[0], batch[row]), row
    assert _common.PDL  # the step's default: the launch carries the programmatic attribute on SM90+
    both = torch.empty(1, 4096, dtype=torch.bfloat16, device="cuda")
    both.copy_(torch.randn(1, 4096).bfloat16())
    clamped_swiglu(both[:, :2048], both[:, 2048:], 10.0)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = clamped_swiglu(both[:, :2048], both[:, 2048:], 10.0)
    for seed in range(3):
        fresh = (8 * torch.randn(1, 4096, generator=torch.Generator().manual_seed(40 + seed))).bfloat16().cuda()
        both.copy_(fresh)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, clamped_swiglu(fresh[:, :2048], fresh[:, 2048:], 10.0)), seed
