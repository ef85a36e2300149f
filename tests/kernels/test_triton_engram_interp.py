"""``engram.gather`` and ``engram.gate``'s Triton launches (``deepinfer_nvidia/kernels/triton_engram.py``) in
Triton's CPU interpreter against the references: the ops' own cases, V4.1 widths (head_dim 256 rows with UE8M0
scales, D 4096 with 4 streams), every e4m3 code (NaN included) and scale bytes 0-255, fp32 and bf16; the gate with
one program per stream (the default) and per token, bit for bit."""
from __future__ import annotations

_INTERPRETED = r"""
import torch
from deepinfer_core.kernels.ops import engram as ref
from deepinfer_nvidia.kernels import triton_engram as te

def same(a, b, atol, rtol):
    torch.testing.assert_close(a.float(), b.float(), atol=atol, rtol=rtol, equal_nan=True)

n = 0
for dtype in (torch.float32, torch.bfloat16):
    for seed in range(2):
        for args, _ in ref._gen_gather(dtype, "cpu", seed):
            same(te.gather(*args, force_kernel=True), ref.gather_rows(*args), 0, 0)
            n += 1
        for args, _ in ref._gen_gate(dtype, "cpu", seed):
            tol = 1e-5 if dtype == torch.float32 else 1e-2
            same(te.gate(*args, force_kernel=True), ref.gate(*args), tol, tol)
            n += 1
# every e4m3 code against every scale byte (exact, NaN where the reference has NaN)
codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).reshape(8, 32)
scale = torch.arange(0, 256, 32, dtype=torch.uint8).reshape(8, 1) + torch.tensor([[7]], dtype=torch.uint8)
scale[-1, 0] = 255
ids = torch.randperm(8).reshape(2, 4)
same(te.gather(codes, scale, ids, torch.float32, force_kernel=True), ref.gather_rows(codes, scale, ids, torch.float32),
     0, 0)
g = torch.Generator().manual_seed(5)
from deepinfer_core.kernels.ops.quant import quant_fp8_block
table, sc = quant_fp8_block(torch.randn(64, 256, generator=g), (1, 32), "ue8m0")
ids = torch.randint(0, 64, (5, 24), generator=g)
same(te.gather(table, sc, ids, torch.bfloat16, force_kernel=True), ref.gather_rows(table, sc, ids, torch.bfloat16),
     0, 0)
t, hc, d = 3, 4, 4096
r = torch.randn(t, hc, d, generator=g).bfloat16()
kv = torch.randn(t, (hc + 1) * d, generator=g).bfloat16()
qw, kw = 1 + 0.1 * torch.randn(hc, d, generator=g), 1 + 0.1 * torch.randn(hc, d, generator=g)
same(te.gate(r, kv, qw, kw, 1e-6, 1e-6, force_kernel=True), ref.gate(r, kv, qw, kw, 1e-6, 1e-6), 1e-2, 1e-2)
same(te.gate(r.float(), kv.float(), qw, kw, 1e-6, 1e-6, force_kernel=True),
     ref.gate(r.float(), kv.float(), qw, kw, 1e-6, 1e-6), 1e-5, 1e-5)
# one program per token (the streams in a loop) gives the same bits as one per stream
assert te.STREAM_PROGRAMS
per_stream = te.gate(r, kv, qw, kw, 1e-6, 1e-6, force_kernel=True)
te.STREAM_PROGRAMS = False
per_token = te.gate(r, kv, qw, kw, 1e-6, 1e-6, force_kernel=True)
assert torch.equal(per_stream, per_token)
print("INTERPRETED", n + 6)
"""


def test_engram_kernels_in_the_interpreter(run_interpreted):
    run_interpreted(_INTERPRETED, "INTERPRETED 34")
