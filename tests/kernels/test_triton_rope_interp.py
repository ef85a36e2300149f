"""The interleaved-RoPE kernel (``deepinfer_nvidia/kernels/triton_rope.py``: ``_rope_kernel``) in Triton's CPU
interpreter against the ``rope.interleaved`` reference. Until now only the H200 conformance harness ran it.
``supports`` asks for CUDA tensors, so the script lets CPU tensors through to the kernel (the launch is in
``rope`` itself).

Covered: fp32, bf16 and fp16; one token and several; one vector a token, 3 and 20 heads (16 vectors a program:
a second, partial program), a 4-D x [T, 2, 3, D]; D 16, 24, 40, 80 and a rotated tail of 2 to D channels (the
whole vector; half-widths 1, 4, 8, 12 and 32, not all powers of two); forward and inverse rotation with the
default and the YaRN frequencies; int64 and int32 positions, among them 0, 10^6 and 2^31 - 1 (the fp64 angle
reduction: an fp32 angle is off by ~0.06 rad at 10^6). The unrotated head must be copied bit for bit; the tail is
compared at the op's ``OpSpec`` tolerance (fp32 1e-4, bf16 3e-2, fp16 2e-3; the interpreter rounds float -> bf16
toward zero, the GPU to nearest)."""
from __future__ import annotations

_INTERPRETED = r"""
import torch
from deepinfer_core.kernels.ops.rope import OPS, apply_rope, default_inv_freq, yarn_inv_freq
from deepinfer_nvidia.kernels import triton_rope as tr

tr.supports = lambda *a: True  # CPU tensors into the interpreted kernel
spec = {op.name: op for op in OPS}["rope.interleaved"]
g = torch.Generator().manual_seed(0)
far = torch.tensor([10 ** 6, 0, 2 ** 31 - 1, 123457, 7])
n_checked = 0
for dt in (torch.float32, torch.bfloat16, torch.float16):
    atol, rtol = spec.tolerance(dt)
    for shape, rd in (((1, 1, 16), 8), ((3, 20, 80), 16), ((2, 3, 24), 24), ((4, 2, 3, 40), 24), ((5, 64), 64),
                      ((2, 1, 8), 2)):
        x = torch.randn(*shape, generator=g).to(dt)
        t = shape[0]
        for pos in (torch.randint(0, 5000, (t,), generator=g), far[:t].to(torch.int32)):
            for inverse, inv_freq in ((False, default_inv_freq(rd, 10000.0)),
                                      (True, yarn_inv_freq(rd, 160000.0, 16.0, 65536))):
                what = (dt, shape, rd, pos.tolist(), inverse)
                out = tr.rope(x, pos, inv_freq, inverse=inverse)
                ref = apply_rope(x, pos, inv_freq, inverse=inverse)
                assert out.shape == ref.shape and out.dtype == ref.dtype, what
                assert torch.equal(out[..., :-rd], ref[..., :-rd]), what
                torch.testing.assert_close(out[..., -rd:], ref[..., -rd:], atol=atol, rtol=rtol,
                                           msg=lambda m: f"{what}: {m}")
                n_checked += 1
print("INTERPRETED", n_checked)
"""


def test_rope_kernel_matches_the_reference_in_the_interpreter(run_interpreted):
    proc = run_interpreted(_INTERPRETED, "INTERPRETED")
    assert int(proc.stdout.split("INTERPRETED")[1].split()[0]) == 72
