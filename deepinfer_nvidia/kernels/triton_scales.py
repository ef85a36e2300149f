"""Triton helpers shared by the FP8 / MXFP4 kernel modules (kept apart so those modules can import it without
importing each other)."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def ue8m0(b):
    """UE8M0 byte (int32) -> fp32 2^(b-127); byte 0 is the denormal 2^-127."""
    bits = tl.where(b == 0, 0x00400000, b << 23)
    return bits.to(tl.float32, bitcast=True)
