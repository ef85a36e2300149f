"""The UE8M0 scale decoder ``ue8m0`` (``deepinfer_nvidia/kernels/triton_scales.py``, a ``@triton.jit`` helper
that the FP8 GEMM, GEMV and fine-block kernels call) in Triton's CPU interpreter, through a one-line kernel that
loads scale bytes as the callers do (uint8 -> int32), against ``quant.ue8m0_to_float``. The GEMM tests only reach
the bytes their random weights produce (around 2^-10); here every byte is decoded: 1-254 must be 2^(b-127) bit for
bit, byte 0 the fp32 denormal 2^-127 (the helper's special case), and byte 255, NaN in the format and never
written by ``float_to_ue8m0``, must at least not decode to a finite scale (the helper gives +inf)."""
from __future__ import annotations

_INTERPRETED = r"""
import torch
import triton
import triton.language as tl
from deepinfer_core.kernels.ops.quant import float_to_ue8m0, ue8m0_to_float
from deepinfer_nvidia.kernels.triton_scales import ue8m0


@triton.jit
def _decode(s_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(y_ptr + i, ue8m0(tl.load(s_ptr + i, mask=m, other=127).to(tl.int32)), mask=m)


def decode(s):
    y = torch.empty(s.shape, dtype=torch.float32)
    _decode[(triton.cdiv(s.numel(), 64),)](s, y, s.numel(), BLOCK=64)
    return y


n_checked = 0
b = torch.arange(256, dtype=torch.uint8)
out, ref = decode(b), ue8m0_to_float(b)
assert torch.equal(out[:255], ref[:255]), (out[:255] != ref[:255]).nonzero().flatten().tolist()
n_checked += 1
assert not torch.isfinite(out[255]), out[255]
n_checked += 1
# scales as stored (float8_e8m0fnu, viewed as bytes), a count that is not a multiple of the block
e = torch.randint(-127, 128, (77,), generator=torch.Generator().manual_seed(0))
s = float_to_ue8m0(torch.ldexp(torch.ones(77), e))
assert torch.equal(decode(s.view(torch.uint8)), ue8m0_to_float(s))
n_checked += 1
print("INTERPRETED", n_checked)
"""


def test_ue8m0_decoder_in_the_interpreter(run_interpreted):
    run_interpreted(_INTERPRETED, "INTERPRETED 3")
