"""Core's MXFP4 word layout (``deepinfer_core.kernels.ops.mxfp4_words``) made in place on the GPU: one Triton pass
over a stack's 32-bit words, reading each word and writing its repacked bits back to the same address.

Why a kernel: the torch form (``pack_words``) works on int64 copies, about 10 bytes of transients a stack byte a
chunk. A model loaded near its memory has no room even for that: the V4.1 slice on an H100 ran out of memory at a
58 MB chunk with 40 MB free (pass40d). This needs no memory at all; each word is read and written by one thread.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_core.kernels.ops.mxfp4_words import word_positions

BLOCK = 1024


@triton.jit
def _place(v, j: tl.constexpr, MAG: tl.constexpr, SIGN: tl.constexpr):
    """Nibble ``j`` of the words ``v`` (uint32): its magnitude bits at ``MAG``, its sign at ``SIGN``."""
    nib = (v >> (4 * j)) & 0xF
    return ((nib & 7) << MAG) | ((nib >> 3) << SIGN)


@triton.jit
def _pack_kernel(w_ptr, n, M0: tl.constexpr, S0: tl.constexpr, M1: tl.constexpr, S1: tl.constexpr,
                 M2: tl.constexpr, S2: tl.constexpr, M3: tl.constexpr, S3: tl.constexpr, M4: tl.constexpr,
                 S4: tl.constexpr, M5: tl.constexpr, S5: tl.constexpr, M6: tl.constexpr, S6: tl.constexpr,
                 M7: tl.constexpr, S7: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = offs < n
    v = tl.load(w_ptr + offs, mask=live, other=0).to(tl.uint32, bitcast=True)
    out = (_place(v, 0, M0, S0) | _place(v, 1, M1, S1) | _place(v, 2, M2, S2) | _place(v, 3, M3, S3)
           | _place(v, 4, M4, S4) | _place(v, 5, M5, S5) | _place(v, 6, M6, S6) | _place(v, 7, M7, S7))
    tl.store(w_ptr + offs, out.to(tl.int32, bitcast=True), mask=live)


def pack_words_inplace(stack: torch.Tensor) -> torch.Tensor:
    """A contiguous checkpoint stack ``[..., K/2]`` uint8 (K/2 a multiple of 4) repacked into the word layout in its
    own storage; returns it viewed as ``int32 [..., K/8]``. ``pack_words`` is the reference."""
    if stack.dtype != torch.uint8 or stack.dim() == 0 or stack.shape[-1] % 4 or not stack.is_contiguous():
        raise ValueError(f"the in-place repack takes a contiguous uint8 stack of whole 4-byte words, got "
                         f"{stack.dtype} {tuple(stack.shape)}")
    words = stack.view(torch.int32)
    n = words.numel()
    if n:
        pos = [p for pair in word_positions() for p in pair]
        names = [f"{kind}{j}" for j in range(8) for kind in ("M", "S")]
        _pack_kernel[(triton.cdiv(n, BLOCK),)](words, n, BLOCK=BLOCK, **dict(zip(names, pos)))
    return words
