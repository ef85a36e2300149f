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


_RMS_ROPE = r"""
import torch
from deepinfer_core.kernels.ops.norm import rms_norm, rms_rope
from deepinfer_core.kernels.ops.rope import default_inv_freq, yarn_inv_freq
from deepinfer_nvidia.kernels import triton_rope as tr

g = torch.Generator().manual_seed(1)
n_checked = 0
for dt, tol in ((torch.float32, 1e-5), (torch.bfloat16, 3e-2)):
    for shape, rd in (((1, 512), 64), ((5, 512), 64), ((3, 2, 96), 16), ((2, 24), 24)):
        x = (3 * torch.randn(*shape, generator=g)).to(dt)
        w = 1 + 0.1 * torch.randn(shape[-1], generator=g)
        pos = torch.tensor([0, 10 ** 6, 2 ** 31 - 1, 77, 5])[:shape[0]]
        for inv_freq in (default_inv_freq(rd, 10000.0), yarn_inv_freq(rd, 160000.0, 16.0, 65536)):
            out = tr.rms_rope(x, w, 1e-6, pos, inv_freq, force_kernel=True)
            ref = rms_rope(x, w, 1e-6, pos, inv_freq)
            assert out.shape == ref.shape and out.dtype == ref.dtype
            # the unrotated head is norm.rms's output (same fp32 ops, one rounding)
            torch.testing.assert_close(out[..., :-rd], rms_norm(x, w, 1e-6)[..., :-rd], atol=tol, rtol=tol)
            torch.testing.assert_close(out, ref, atol=tol, rtol=tol)
            n_checked += 1
try:
    tr.rms_rope(x, w[:-1], 1e-6, pos, inv_freq, force_kernel=True)
except ValueError as exc:
    assert "weight" in str(exc)
    n_checked += 1
print("INTERPRETED", n_checked)
"""


def test_rms_rope_kernel_matches_the_reference_in_the_interpreter(run_interpreted):
    """``norm.rms_rope``'s fused kernel (``_rms_rope_kernel``, one program a vector): fp32 and bf16, a KV row width
    (512, rope 64), several vectors a token, a fully rotated vector, positions up to 2^31 - 1."""
    run_interpreted(_RMS_ROPE, "INTERPRETED 17")


def test_rms_rope_off_runs_its_parts(monkeypatch):
    """Switched off (``DEEPINFER_NV_NORM_ROPE_FUSED=0``), and on (the default) with operands the kernel does not cover
    (CPU tensors): the parts hand off to the references, so the output is the reference's, bit for bit."""
    import pytest
    import torch

    pytest.importorskip("triton")
    from deepinfer_core.kernels.ops.norm import rms_rope
    from deepinfer_core.kernels.ops.rope import default_inv_freq
    from deepinfer_nvidia.kernels import triton_rope as tr

    x, w, pos = torch.randn(3, 512), torch.rand(512) + 0.5, torch.tensor([1, 2, 3])
    f = default_inv_freq(64, 10000.0)
    for fused in (False, True):
        monkeypatch.setattr(tr, "RMS_ROPE_FUSED", fused)
        assert torch.equal(tr.rms_rope(x, w, 1e-6, pos, f), rms_rope(x, w, 1e-6, pos, f))
