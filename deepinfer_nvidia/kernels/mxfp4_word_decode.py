"""The MXFP4 word decoder of the swap-AB expert kernels (``gluon_moe_swap``): the inline PTX that turns 4 packed
bytes (8 e2m1 nibbles) into 4 bf16x2 registers times a UE8M0 scale, and its pure-Python model, which the CPU tests
check against the MXFP4 definition for every code and scale (no GPU needed)."""
from __future__ import annotations

import torch

from deepinfer_core.kernels.ops.mxfp4_words import WORD_PLAN

# Per output register r (nibbles r and r+4 of a word): (magnitude shift, shifted right?, sign shift). The
# magnitude bits of nibble r land on bf16 bits 6-8 (r+4: 22-24), its sign bit on 15 (r+4: 31).
_PAIR_SHIFTS = ((6, False, 12), (2, False, 8), (2, True, 4), (6, True, 0))


def _pair_asm(shift_a: int, right: bool, shift_b: int, out: int, safe: bool) -> str:
    """PTX for one output register: nibbles j and j+4 of word $4 -> bf16x2 (exact) times the scale $5."""
    a = f"shr.b32 a, $4, {shift_a}; " if right else f"shl.b32 a, $4, {shift_a}; "
    b = f"shl.b32 b, $4, {shift_b}; " if shift_b else "mov.b32 b, $4; "
    scale = f"mul.rn.bf16x2 a, a, c; mul.rn.bf16x2 ${out}, a, $5; " if safe else f"mul.rn.bf16x2 ${out}, a, $5; "
    return a + b + "and.b32 b, b, 0x80008000; lop3.b32 a, a, 0x01C001C0, b, 0xEA; " + scale


def _word_asm(safe: bool) -> str:
    """4 packed bytes (8 e2m1 nibbles) -> registers (e0,e4) (e1,e5) | (e2,e6) (e3,e7) as scaled bf16x2.
    Nibble j sits at bits 4j..4j+3: its magnitude goes to bits 6-8 and its sign to bit 15 (j+4: 22-24, 31)."""
    head = "{ .reg .b32 a, b, c; mov.b32 c, 0x7E807E80; "  # c = 2^126 in both bf16 halves
    return head + "".join(_pair_asm(*shifts, out, safe) for out, shifts in enumerate(_PAIR_SHIFTS)) + "}"


def _bf16x2_mul(x: int, y: int) -> int:
    """Both bf16 halves of two 32-bit words multiplied with round-to-nearest-even (torch's bf16 rounding)."""
    out = 0
    for h in (0, 16):
        vx, vy = (torch.tensor([(v >> h) & 0xFFFF], dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
                  for v in (x, y))
        out |= ((vx * vy).to(torch.bfloat16).view(torch.int16).item() & 0xFFFF) << h
    return out


def decode_word_reference(word: int, scale_bits: int, safe: bool = True) -> list[int]:
    """Pure-Python model of ``_word_asm`` on one 32-bit word (CPU tests): its 4 output registers.
    ``scale_bits``: the bf16x2 scale operand the kernel passes (2^(s-127), or 2^(s-1) when not ``safe``)."""
    regs = []
    for shift_a, right, shift_b in _PAIR_SHIFTS:
        a = (word >> shift_a) if right else (word << shift_a) & 0xFFFFFFFF
        b = (word << shift_b) & 0xFFFFFFFF
        v = (a & 0x01C001C0) | (b & 0x80008000)
        regs.append(_bf16x2_mul(_bf16x2_mul(v, 0x7E807E80), scale_bits) if safe else _bf16x2_mul(v, scale_bits))
    return regs


# -- the word layout (core's ``mxfp4_words``: the stacks repacked once at load) -----------------------------------
def _shift_ptx(dst: str, shift: int) -> str:
    if shift == 0:
        return f"mov.b32 {dst}, $4; "
    return f"shl.b32 {dst}, $4, {shift}; " if shift > 0 else f"shr.b32 {dst}, $4, {-shift}; "


def _packed_word_asm(safe: bool) -> str:
    """PTX of the word layout's decode (``WORD_PLAN``): word $4 -> registers (e0,e4) (e1,e5) | (e2,e6) (e3,e7)
    times the scale $5, the registers ``_word_asm`` gives for the same elements. Registers whose magnitudes and
    signs move together take one shift (or none) and a mask: 15 instructions a word in the fast form."""
    text = "{ .reg .b32 a, b, c; mov.b32 c, 0x7E807E80; "
    for out, (m, s) in enumerate(WORD_PLAN):
        if m == s:
            text += ("and.b32 a, $4, 0x81C081C0; " if m == 0 else _shift_ptx("a", m) + "and.b32 a, a, 0x81C081C0; ")
        else:
            text += (_shift_ptx("a", m) + _shift_ptx("b", s)
                     + "and.b32 b, b, 0x80008000; lop3.b32 a, a, 0x01C001C0, b, 0xEA; ")
        text += f"mul.rn.bf16x2 a, a, c; mul.rn.bf16x2 ${out}, a, $5; " if safe else f"mul.rn.bf16x2 ${out}, a, $5; "
    return text + "}"


def decode_packed_word_reference(word: int, scale_bits: int, safe: bool = True) -> list[int]:
    """Pure-Python model of ``_packed_word_asm`` on one word-layout 32-bit word: its 4 output registers."""
    def shifted(v: int, sh: int) -> int:
        return (v << sh) & 0xFFFFFFFF if sh >= 0 else v >> -sh

    regs = []
    for m, s in WORD_PLAN:
        v = (shifted(word, m) & 0x01C001C0) | (shifted(word, s) & 0x80008000)
        regs.append(_bf16x2_mul(_bf16x2_mul(v, 0x7E807E80), scale_bits) if safe else _bf16x2_mul(v, scale_bits))
    return regs
