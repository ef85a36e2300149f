"""The shared expert's activation kernel (``deepinfer_nvidia/kernels/triton_swiglu.py``) in Triton's CPU
interpreter against the ``moe.clamped_swiglu`` reference. ``clamped_swiglu`` hands CPU tensors to the reference,
so the script calls the launcher ``_launch`` directly.

Covered: fp32 (silu in fp64, as the reference), bf16 and fp16; one row and 17 rows; widths 64, 96, 1536 and 2048
(a partial second program at 1536); gate and up as contiguous tensors and as the two column halves of one
``[T, 2F]`` product (row stride 2F, no copy); values well past the limit on both sides (clamped), the limit itself,
zeros and a negative limit-sized gate. The OpSpec tolerances apply (the interpreter rounds float -> bf16 toward
zero where the GPU rounds to nearest); fp32 outputs must agree to 2 ulp. The clamp must hold exactly: where
gate >= L the output is silu(L) * clamp(up) whatever gate was."""
from __future__ import annotations

_INTERPRETED = r"""
import torch
from deepinfer_core.kernels.ops.moe import OPS, clamped_swiglu
from deepinfer_nvidia.kernels import triton_swiglu as ts

spec = {op.name: op for op in OPS}["moe.clamped_swiglu"]
g = torch.Generator().manual_seed(0)
n_checked = 0
L = 10.0
for dt in (torch.float32, torch.bfloat16, torch.float16):
    for t, f in ((1, 64), (17, 96), (3, 1536), (2, 2048)):
        for merged in (False, True):
            both = 8 * torch.randn(t, 2 * f, generator=g)
            both[0, :4] = torch.tensor([L, 1e4, 0.0, -L])  # the limit, far past it, zero, the negative limit
            both[0, f:f + 4] = torch.tensor([-1e4, L, 0.0, 1e4])
            both = both.to(dt)
            gate, up = both[:, :f], both[:, f:]
            if not merged:
                gate, up = gate.contiguous(), up.contiguous()
            out, ref = ts._launch(gate, up, L), clamped_swiglu(gate, up, L)
            assert out.shape == ref.shape and out.dtype == ref.dtype and out.is_contiguous()
            atol, rtol = spec.tolerance(dt)
            if dt == torch.float32:
                atol, rtol = 1e-6, 2.5e-7
            torch.testing.assert_close(out, ref, atol=atol, rtol=rtol, msg=lambda m: f"{dt} {t}x{f} {merged}: {m}")
            # the clamp: gate 1e4 gives silu(L) * clamp(up) exactly as gate L does
            assert torch.equal(out[0, 1], clamped_swiglu(torch.full_like(gate[:1, 1:2], L), up[:1, 1:2], L)[0, 0]) \
                or dt != torch.float32, (out[0, :4], ref[0, :4])
            assert out[0, 2] == 0 and torch.isfinite(out.float()).all()
            n_checked += 1
print("INTERPRETED", n_checked)
"""


def test_clamped_swiglu_kernel_matches_the_reference_in_the_interpreter(run_interpreted):
    proc = run_interpreted(_INTERPRETED, "INTERPRETED")
    assert int(proc.stdout.split("INTERPRETED")[1].split()[0]) == 24
