"""CPU checks of the Gluon swap-AB expert kernels' bit tricks (``deepinfer_nvidia.kernels.gluon_moe_swap``).

The kernels themselves need an SM90 GPU (``deepinfer_nvidia/tests/bench_swap.py`` and the conformance file run
them there). Here: the Python model of the inline PTX decoder, built from the same shift constants, against
the MXFP4 definition (E2M1 code * 2^(s - 127), exact in bf16) for every code, scale bytes over the whole
range with the exact two-multiply form and over 0..128 with the one-multiply form; and the K order contract
(``_decode``'s register order equals the wrapper's bit-reversed activation layout).
"""
from __future__ import annotations

import random

import pytest
import torch

from deepinfer_core.kernels.ops.quant import E2M1_VALUES
from deepinfer_nvidia.kernels.mxfp4_word_decode import _word_asm, decode_word_reference

# register r holds (low half, high half) = natural elements (ORDER[r][0], ORDER[r][1]) of the word's 8 nibbles
ORDER = ((0, 4), (1, 5), (2, 6), (3, 7))


def _bf16_bits(v: float) -> int:
    return torch.tensor([v], dtype=torch.float32).to(torch.bfloat16).view(torch.int16).item() & 0xFFFF


def _expected(word: int, s: int) -> list[int]:
    vals = [E2M1_VALUES[(word >> (4 * j)) & 0xF] * 2.0 ** (s - 127) for j in range(8)]
    return [_bf16_bits(vals[a]) | (_bf16_bits(vals[b]) << 16) for a, b in ORDER]


def _scale_operand(s: int, safe: bool) -> int:
    bits = (64 if s == 0 else s << 7) if safe else (s + 126) << 7  # as the kernel builds them
    return bits | (bits << 16)


def test_every_code_and_scale_exact_with_two_multiplies():
    words = [sum(((i + j) % 16) << (4 * j) for j in range(8)) for i in range(16)]  # every code in every slot
    for s in list(range(0, 255, 7)) + [0, 1, 127, 128, 129, 254]:
        for w in words:
            assert decode_word_reference(w, _scale_operand(s, True), safe=True) == _expected(w, s), (hex(w), s)


def test_one_multiply_form_exact_up_to_scale_128():
    rng = random.Random(0)
    for s in range(0, 129):
        for _ in range(4):
            w = rng.getrandbits(32)
            assert decode_word_reference(w, _scale_operand(s, False), safe=False) == _expected(w, s), (hex(w), s)


def test_one_multiply_form_overflows_above_128():
    # why the wrapper checks the scale bytes: 2^(s-1) is not a finite bf16 from s = 129 on
    w = 0x22222222  # code 2 = 1.0 everywhere
    assert decode_word_reference(w, _scale_operand(129, False), safe=False) != _expected(w, 129)


def test_asm_text_matches_the_model_constants():
    text = _word_asm(True)
    for piece in ("shl.b32 a, $4, 6;", "shl.b32 b, $4, 12;", "shl.b32 a, $4, 2;", "shl.b32 b, $4, 8;",
                  "shr.b32 a, $4, 2;", "shl.b32 b, $4, 4;", "shr.b32 a, $4, 6;", "mov.b32 b, $4;",
                  "0x01C001C0", "0x80008000", "0x7E807E80"):
        assert piece in text
    assert text.count("mul.rn.bf16x2") == 8 and _word_asm(False).count("mul.rn.bf16x2") == 4


def test_k_order_contract():
    # _decode: o_s[4q + 2*p1 + p0] = natural 8q + 4*p0 + p1 + 2*s, joined and permuted to (q, p1, s, p0)
    logical = []
    for q in range(2):
        for p1 in range(2):
            for s in range(2):
                for p0 in range(2):
                    logical.append(8 * q + 4 * p0 + p1 + 2 * s)
    # the activation side: x.reshape(.., 8ths, 2, 2, 2).permute(0, 1, 4, 3, 2) = bit reversal of the low 3 bits
    x = torch.arange(16).reshape(1, 2, 2, 2, 2).permute(0, 1, 4, 3, 2).reshape(16).tolist()
    assert logical == x
    rev3 = [(n & -8) | ((n & 1) << 2) | (n & 2) | ((n >> 2) & 1) for n in range(16)]  # the h store of the up kernel
    assert [rev3[k] for k in range(16)] == x
    # each consecutive logical pair is one whole output register (o0 = $0 $1, o1 = $2 $3): no repacking
    pairs = [tuple(logical[i:i + 2]) for i in range(0, 8, 2)]
    assert pairs == [ORDER[0], ORDER[2], ORDER[1], ORDER[3]]


def test_scale_check_picks_the_exact_decode_when_needed():
    from deepinfer_nvidia.kernels.gluon_moe_swap import scales_allow_fast

    ok = torch.full((3, 4), 128, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    big = torch.full((3, 4), 120, dtype=torch.uint8)
    big[2, 3] = 129
    big = big.view(torch.float8_e8m0fnu)
    assert scales_allow_fast(ok) and not scales_allow_fast(big) and not scales_allow_fast(ok, big)
    fresh = torch.full((3, 4), 200, dtype=torch.uint8).view(torch.float8_e8m0fnu)  # a new stack is checked anew
    assert not scales_allow_fast(fresh)


def _decoder_halves_index(c_count: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """Physical element index (within a 128-element tile of one weight row) of each value of the decoder's two
    outputs for the fragment layout: thread c holds bytes 16c..16c+15; word q of them gives registers
    rho = 0..3 = nibbles (rho, rho + 4), o0 packing rho 0, 1 and o1 rho 2, 3 (two values each)."""
    o = torch.empty(2, c_count, 16, dtype=torch.long)
    for c in range(c_count):
        for q in range(4):
            for rho in range(4):
                for e in range(2):
                    o[rho // 2, c, 4 * q + 2 * (rho % 2) + e] = 32 * c + 8 * q + rho + 4 * e
    return o[0], o[1]


def test_fragment_k_order_contract():
    from deepinfer_nvidia.kernels.gluon_moe_swap import permute_k

    o0, o1 = _decoder_halves_index()
    # the kernel's _decode_fragment: join, reshape (c, q, p, e, S), permute to (q, S, p, c, e), flatten
    logical = torch.stack([o0, o1], -1).reshape(4, 4, 2, 2, 2).permute(1, 4, 2, 0, 3).reshape(128)
    assert sorted(logical.tolist()) == list(range(128))
    # the activations follow the same order (the wrapper's permutation, two tiles of 128)
    x = torch.arange(256)[None]
    assert torch.equal(permute_k(x, True)[0], torch.cat([logical, logical + 128]))
    # the up kernel's h store (_frag128) sends natural column n to its logical position
    def frag128(n):
        m = n % 128
        return (n - m) + 32 * ((m // 8) % 4) + 16 * ((m // 2) % 2) + 8 * (m % 2) + 2 * (m // 32) + (m // 4) % 2
    for n in range(256):
        assert permute_k(x, True)[0][frag128(n)] == n
    # thread c holds exactly the A-fragment columns of a k16 step: (k // 2) % 4 == c
    for k in range(128):
        c = logical[k].item() // 32
        assert (k // 2) % 4 == c


def test_a_triton_that_cannot_compile_the_kernels_switches_the_path_off(monkeypatch, caplog):
    from triton.compiler.errors import CompilationError

    from deepinfer_nvidia.kernels import gluon_moe_swap as sw

    def broken(*args, **kwargs):
        raise CompilationError("k.py", None, "AttributeError: no attribute 'thread_barrier'")

    monkeypatch.setattr(sw, "swap_mxfp4", broken)
    monkeypatch.setattr(sw, "SWAP_MAX_PAIRS", 98304)
    with caplog.at_level("WARNING"):
        assert sw.swap_or_none(1, 2, limit=3) is None
    assert sw.SWAP_MAX_PAIRS == 0 and "do not compile" in caplog.text

    def other(*args, **kwargs):
        raise ValueError("a real bug")

    monkeypatch.setattr(sw, "swap_mxfp4", other)
    with pytest.raises(ValueError, match="a real bug"):  # other errors propagate
        sw.swap_or_none()


def test_split_k_policy(monkeypatch):
    """``split_for`` (the up launch; 132 SMs, 3 resident programs each = 396): the V4.1 launches measured on the
    H200 split where they gained (2 tokens: 12 blocks x 36 tiles = 432 programs; 6 tokens: 38 x 36 = 1368) and
    not where they did not (1 token: 216; 8 tokens: 51 x 36 = 1836); SPLIT_UP 1 turns it off; short K keeps
    SPLIT_MIN_TILES a split. ``SPLIT_FILL`` splits launches under one wave into as many ranges as fit in it
    (216 programs: 2 at 4 resident programs an SM, 1 at 3). For any request the evened count leaves no split
    empty, the kernel's ranges (k0 = s * TPS, min(K tiles - k0, TPS)) covering every K tile once."""
    from deepinfer_nvidia.kernels import gluon_swap_split as sp

    monkeypatch.setattr(sp, "SPLIT_UP", 3)
    monkeypatch.setattr(sp, "SPLIT_WAVES", (1.0, 3.5))
    monkeypatch.setattr(sp, "RESIDENT_UP", 3)
    monkeypatch.setattr(sp, "SPLIT_MIN_TILES", 4)
    monkeypatch.setattr(sp, "SPLIT_FILL", False)
    assert [sp.split_for(n, 40, 132) for n in (216, 396, 432, 1368, 1836)] == [1, 1, 3, 3, 1]
    assert sp.split_for(432, 9, 132) == 2      # 9 K tiles // 4
    assert sp.split_for(432, 7, 132) == 1
    monkeypatch.setattr(sp, "SPLIT_FILL", True)
    assert [sp.split_for(n, 40, 132) for n in (36, 100, 216, 396, 432)] == [3, 3, 1, 1, 3]
    monkeypatch.setattr(sp, "RESIDENT_UP", 4)
    assert [sp.split_for(n, 40, 132) for n in (216, 264, 265, 528, 600)] == [2, 2, 1, 1, 3]
    assert sp.split_for(100, 7, 132) == 1      # 7 K tiles: no range of 4
    monkeypatch.setattr(sp, "SPLIT_UP", 1)
    assert sp.split_for(432, 40, 132) == 1
    assert sp.split_for(36, 40, 132) == 1
    for kt in range(1, 65):
        for want in range(1, 9):
            s = sp.even_split(want, kt)
            tps = -(-kt // s)
            sizes = [min(kt - i * tps, tps) for i in range(s)]
            assert 1 <= s <= want and min(sizes) >= 1 and sum(sizes) == kt, (kt, want, s, sizes)


def test_up_register_cap_option(monkeypatch):
    """``up_options``: the compile option only when a cap is set (argument first, then ``UP_MAXNREG``)."""
    from deepinfer_nvidia.kernels import gluon_swap_split as sp

    monkeypatch.setattr(sp, "UP_MAXNREG", None)
    assert sp.up_options() == {} and sp.up_options(128) == {"maxnreg": 128}
    monkeypatch.setattr(sp, "UP_MAXNREG", 128)
    assert sp.up_options() == {"maxnreg": 128} and sp.up_options(120) == {"maxnreg": 120}


def test_tma_weight_descriptors():
    """The TMA path's host side: a packed stack [E, N, K/2] is described as [E*N, K/32, 16] bytes with boxes
    [64, 4, 16] (one 128-column tile of 64 rows, the bytes of the cp.async ring's slot); ``tma_fits`` refuses N not
    a multiple of the tile (a box would cross into the next expert) and rows whose bytes are not a multiple of 16."""
    from deepinfer_nvidia.kernels import gluon_moe_swap as sw

    w = torch.zeros(3, 128, 320, dtype=torch.uint8)
    da, db = sw._weight_descs(w, None, 64, 128)
    assert db is da
    assert list(da.shape) == [384, 20, 16] and list(da.strides) == [320, 16, 1] and list(da.block_shape) == [64, 4, 16]
    assert da.base.data_ptr() == w.data_ptr()
    assert sw.tma_fits(w, 64, 128)
    assert not sw.tma_fits(torch.zeros(3, 96, 320, dtype=torch.uint8), 64, 128)     # N = 96
    assert not sw.tma_fits(torch.zeros(3, 128, 40, dtype=torch.uint8), 64, 128)     # 40-byte rows
    assert not sw.tma_fits(w[:, :, :160], 64, 128)                                  # not contiguous


class _Recorder:
    """Stands in for a Gluon kernel: ``kernel[grid](*args, **kw)`` records the call instead of launching."""

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        return lambda *args, **kw: self.calls.append((grid, args, kw))


@pytest.mark.parametrize("f,tma", [(128, True), (96, True), (128, False)])
def test_tma_wiring_of_the_swap_launches(monkeypatch, f, tma):
    """``swap_mxfp4(tma=True)`` passes TMA=1 and each launch's descriptors (up: w1 and w3, down: w2 twice) when
    the stacks fit, and falls back to TMA=0 without descriptors when one does not (F = 96: not a multiple of the
    64-row tile); the kernels are recorded, not launched (no GPU here)."""
    from deepinfer_core.kernels.ops.quant import quant_mxfp4
    from deepinfer_nvidia.kernels import gluon_moe_swap as sw
    from deepinfer_nvidia.kernels import triton_gemm

    rec = _Recorder()
    monkeypatch.setattr(sw, "_swap_kernel", rec)
    monkeypatch.setattr(triton_gemm, "sum_slices", lambda y, t, d, *a: torch.zeros(t, d))
    g = torch.Generator().manual_seed(0)
    e, d = 4, 256

    def stack(n, k):
        q = [quant_mxfp4(torch.randn(n, k, generator=g)) for _ in range(e)]
        return [torch.stack([a for a, _ in q]), torch.stack([b for _, b in q])]

    ws = stack(f, d) + stack(f, d) + stack(d, f)
    x = torch.randn(2, d, generator=g).bfloat16()
    ids = torch.tensor([[0, 1], [1, 3]])
    sw.swap_mxfp4(x, torch.rand(2, 2), ids, *ws, 1.0, split=(1, 1), tma=tma)
    (_, _, up), (_, _, down) = rec.calls
    fits = tma and f % 64 == 0
    assert up["TMA"] == down["TMA"] == int(fits)
    if not fits:
        assert up["wa_desc"] is up["wb_desc"] is down["wa_desc"] is None
        return
    assert up["wa_desc"].base.data_ptr() == ws[0].data_ptr() and up["wb_desc"].base.data_ptr() == ws[2].data_ptr()
    assert list(up["wa_desc"].shape) == [e * f, d // 32, 16] and list(down["wa_desc"].shape) == [e * d, f // 32, 16]
    assert down["wb_desc"] is down["wa_desc"]


def _packed_word(word: int) -> int:
    from deepinfer_core.kernels.ops.mxfp4_words import pack_words

    packed = pack_words(torch.tensor(list(word.to_bytes(4, "little")), dtype=torch.uint8))
    return int.from_bytes(bytes(packed.tolist()), "little")


def test_word_layout_decodes_to_the_same_registers():
    """The word layout's decode (15 instructions) gives the checkpoint decode's registers, bit for bit, for every
    code in every slot and random words, with both multiply forms."""
    from deepinfer_nvidia.kernels.mxfp4_word_decode import decode_packed_word_reference

    rng = random.Random(1)
    words = [sum(((i + j) % 16) << (4 * j) for j in range(8)) for i in range(16)] + [rng.getrandbits(32)
                                                                                   for _ in range(64)]
    for s in (0, 1, 64, 126, 127, 128):
        for w in words:
            p = _packed_word(w)
            for safe in (True, False):
                op = _scale_operand(s, safe)
                assert decode_packed_word_reference(p, op, safe) == decode_word_reference(w, op, safe), (hex(w), s)
    for s in (129, 200, 254):  # the exact form over the rest of the range
        for w in words[:16]:
            op = _scale_operand(s, True)
            assert decode_packed_word_reference(_packed_word(w), op, True) == _expected(w, s)


def test_word_layout_is_a_bit_permutation_with_an_inverse():
    from deepinfer_core.kernels.ops.mxfp4_words import pack_words, unpack_words, word_positions
    from deepinfer_nvidia.kernels.mxfp4_word_decode import _packed_word_asm

    cells = sorted(b for mag, sign in word_positions() for b in (mag, mag + 1, mag + 2, sign))
    assert cells == list(range(32))  # every bit of the word is one element's bit, once
    g = torch.Generator().manual_seed(0)
    w = torch.randint(0, 256, (3, 5, 64), generator=g, dtype=torch.uint8)
    p = pack_words(w)
    assert p.shape == w.shape and p.dtype == torch.uint8 and not torch.equal(p, w)
    assert torch.equal(unpack_words(p), w)
    with pytest.raises(ValueError, match="whole 4-byte words"):
        pack_words(torch.zeros(2, 6, dtype=torch.uint8))
    # 15 instructions a word in the fast form (the twenty-seventh pass's search), 19 in the checkpoint's
    import re

    assert len(re.findall(r"\b(shl|shr|and|lop3|mul)\.", _packed_word_asm(False))) == 15


def test_in_place_repack_kernel_in_the_interpreter(run_interpreted):
    """``triton_words.pack_words_inplace`` (the nvidia layout op's repack: no memory beyond the stack) against core's
    ``pack_words``, in its own storage, over a few blocks with a tail; bad stacks named."""
    run_interpreted(r"""
import torch
from deepinfer_core.kernels.ops.mxfp4_words import pack_words
from deepinfer_nvidia.kernels.triton_words import pack_words_inplace
g = torch.Generator().manual_seed(0)
for shape in [(3, 5, 8), (2, 300, 12), (1, 1, 4)]:
    w = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
    want, ptr = pack_words(w), w.data_ptr()
    out = pack_words_inplace(w)
    assert out.dtype == torch.int32 and out.data_ptr() == ptr and torch.equal(out.view(torch.uint8), want), shape
for bad in (torch.zeros(2, 6, dtype=torch.uint8), torch.zeros(4, 8, dtype=torch.uint8).t()):
    try:
        pack_words_inplace(bad)
        raise AssertionError("taken")
    except ValueError as exc:
        assert "whole 4-byte words" in str(exc)
print("REPACKED")
""", "REPACKED")
