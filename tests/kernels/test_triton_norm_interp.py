"""The RMSNorm kernel (``deepinfer_nvidia/kernels/triton_norm.py``: ``_rms_kernel``, weighted and weightless) in
Triton's CPU interpreter against the ``norm.rms`` and ``norm.rms_unweighted`` references. Until now only the H200
conformance harness ran it. ``rms`` / ``rms_unweighted`` hand CPU tensors to the reference, so the script calls
the launcher ``_launch`` directly.

Covered: fp32, bf16 and fp16 rows with fp32 weights and weights in x's dtype; one row, 70 rows (64 rows a program:
a second, partial program), widths 1, 80 and 1280 (not powers of two: masked columns must not enter the mean),
16384 (the widest row served), a 3-D input; and rows whose mean square is near ``eps`` (x ~ 1e-3) or zero (the
output must be exactly 0, not NaN). Tolerances are the ops' ``OpSpec`` ones (fp32 1e-4, bf16 2e-2, fp16 2e-3);
the interpreter rounds float -> bf16 toward zero where the GPU rounds to nearest, so bf16 outputs sit up to two
units from the reference's here (one for the weighted form), inside that bound."""
from __future__ import annotations

_INTERPRETED = r"""
import torch
from deepinfer_core.kernels.ops.norm import OPS, rms_norm, rms_norm_unweighted
from deepinfer_nvidia.kernels import triton_norm as tn

spec = {op.name: op for op in OPS}
g = torch.Generator().manual_seed(0)
n_checked = 0


def close(out, ref, op, what):
    global n_checked
    assert out.shape == ref.shape and out.dtype == ref.dtype, (what, out.shape, ref.shape, out.dtype, ref.dtype)
    atol, rtol = spec[op].tolerance(ref.dtype)
    torch.testing.assert_close(out, ref, atol=atol, rtol=rtol, msg=lambda m: f"{what}: {m}")
    n_checked += 1


eps = 1e-6
for dt in (torch.float32, torch.bfloat16, torch.float16):
    for shape in ((1, 8), (70, 64), (3, 80), (5, 1), (2, 3, 1280), (1, 16384), (4, 96)):
        x = torch.randn(*shape, generator=g)
        if shape == (4, 96):  # row scales: ordinary, mean square ~ eps, zero, large
            x = x * torch.tensor([1.0, 1e-3, 0.0, 30.0])[:, None]
        x = x.to(dt)
        w = 1 + 0.1 * torch.randn(shape[-1], generator=g)
        for wd in sorted({torch.float32, dt}, key=str):
            close(tn._launch(x, w.to(wd), eps), rms_norm(x, w.to(wd), eps), "norm.rms", (dt, shape, wd))
        out = tn._launch(x, None, eps)
        close(out, rms_norm_unweighted(x, eps), "norm.rms_unweighted", (dt, shape))
        if shape == (4, 96):
            assert torch.equal(out[2], torch.zeros_like(out[2])), out[2]
            assert torch.equal(tn._launch(x, w, eps)[2], torch.zeros_like(out[2]))
            n_checked += 1
print("INTERPRETED", n_checked)
"""


def test_rms_norm_kernel_matches_the_references_in_the_interpreter(run_interpreted):
    proc = run_interpreted(_INTERPRETED, "INTERPRETED")
    assert int(proc.stdout.split("INTERPRETED")[1].split()[0]) == 59
