"""The MXFP4 word decoder of the swap-AB expert kernels (``gluon_moe_swap``): the inline PTX that turns 4 packed
bytes (8 e2m1 nibbles) into 4 bf16x2 registers times a UE8M0 scale, and its pure-Python model, which the CPU tests
check against the MXFP4 definition for every code and scale (no GPU needed).

One generator serves both bit layouts, each a plan: per output register r (elements r and r+4 of the word), the
(magnitude shift, sign shift) that bring its elements' magnitude bits to bf16 bits 6-8 / 22-24 and signs to 15 / 31
(a left shift when >= 0, else a right shift). ``CHECKPOINT_PLAN``: nibble j at bits 4j..4j+3, two shifts, a mask and
a merge a register (19 instructions a word). ``WORD_PLAN`` (core's ``mxfp4_words``, repacked at load): registers
whose magnitudes and signs move together take one shift (or none) and a mask (15)."""
from __future__ import annotations

import torch

from deepinfer_core.kernels.ops.mxfp4_words import WORD_PLAN

CHECKPOINT_PLAN = ((6, 12), (2, 8), (-2, 4), (-6, 0))


def _shift_ptx(dst: str, shift: int) -> str:
    if shift == 0:
        return f"mov.b32 {dst}, $4; "
    return f"shl.b32 {dst}, $4, {shift}; " if shift > 0 else f"shr.b32 {dst}, $4, {-shift}; "


def _plan_asm(plan, safe: bool) -> str:
    """PTX of ``plan``'s decode: word $4 -> registers (e0,e4) (e1,e5) | (e2,e6) (e3,e7) as bf16x2 times the scale $5
    (``safe``: first times 2^126, then the scale 2^(s-127); else once by 2^(s-1))."""
    text = "{ .reg .b32 a, b, c; mov.b32 c, 0x7E807E80; "  # c = 2^126 in both bf16 halves
    for out, (m, s) in enumerate(plan):
        if m == s:  # magnitudes and signs move together: one shift (or none) and one mask
            text += ("and.b32 a, $4, 0x81C081C0; " if m == 0 else _shift_ptx("a", m) + "and.b32 a, a, 0x81C081C0; ")
        else:
            text += (_shift_ptx("a", m) + _shift_ptx("b", s)
                     + "and.b32 b, b, 0x80008000; lop3.b32 a, a, 0x01C001C0, b, 0xEA; ")
        text += f"mul.rn.bf16x2 a, a, c; mul.rn.bf16x2 ${out}, a, $5; " if safe else f"mul.rn.bf16x2 ${out}, a, $5; "
    return text + "}"


def _bf16x2_mul(x: int, y: int) -> int:
    """Both bf16 halves of two 32-bit words multiplied with round-to-nearest-even (torch's bf16 rounding)."""
    out = 0
    for h in (0, 16):
        vx, vy = (torch.tensor([(v >> h) & 0xFFFF], dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
                  for v in (x, y))
        out |= ((vx * vy).to(torch.bfloat16).view(torch.int16).item() & 0xFFFF) << h
    return out


def _plan_reference(plan, word: int, scale_bits: int, safe: bool) -> list[int]:
    """Pure-Python model of ``_plan_asm(plan, safe)`` on one 32-bit word: its 4 output registers."""
    def shifted(v: int, sh: int) -> int:
        return (v << sh) & 0xFFFFFFFF if sh >= 0 else v >> -sh

    regs = []
    for m, s in plan:
        v = (shifted(word, m) & 0x01C001C0) | (shifted(word, s) & 0x80008000)
        regs.append(_bf16x2_mul(_bf16x2_mul(v, 0x7E807E80), scale_bits) if safe else _bf16x2_mul(v, scale_bits))
    return regs


def _word_asm(safe: bool) -> str:
    """The checkpoint layout's decode (``CHECKPOINT_PLAN``)."""
    return _plan_asm(CHECKPOINT_PLAN, safe)


def _packed_word_asm(safe: bool) -> str:
    """The word layout's decode (``WORD_PLAN``): the same registers for the same elements, 15 instructions a word
    in the fast form."""
    return _plan_asm(WORD_PLAN, safe)


def decode_word_reference(word: int, scale_bits: int, safe: bool = True) -> list[int]:
    """Model of ``_word_asm`` on one checkpoint word (CPU tests). ``scale_bits``: the bf16x2 scale operand the
    kernel passes (2^(s-127), or 2^(s-1) when not ``safe``)."""
    return _plan_reference(CHECKPOINT_PLAN, word, scale_bits, safe)


def decode_packed_word_reference(word: int, scale_bits: int, safe: bool = True) -> list[int]:
    """Model of ``_packed_word_asm`` on one word-layout word."""
    return _plan_reference(WORD_PLAN, word, scale_bits, safe)
