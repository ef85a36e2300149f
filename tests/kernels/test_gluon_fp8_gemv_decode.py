"""CPU checks of the swap-AB wgmma FP8 GEMV's bit tricks (``deepinfer_nvidia.kernels.gluon_fp8_gemv``).

The kernel needs an SM90 GPU (``deepinfer_nvidia/tests/test_conformance_fp8_wgmma.py`` runs it there). Here:
the Python model of the inline PTX decoder against the e4m3 definition (``bf16(code * 2^(s - 127))``, the
reference's rounding) for every finite code in every byte slot, with the exact two-multiply form over the whole
scale range and the one-multiply form up to scale byte 134; and the K-order contract between the decoder's
register order, ``_decode``'s relabelling and ``permute_x``.
"""
from __future__ import annotations

import random

import pytest
import torch

gg = pytest.importorskip("deepinfer_nvidia.kernels.gluon_fp8_gemv")


def _bf16_bits(v: float) -> int:
    return torch.tensor([v], dtype=torch.float64).to(torch.bfloat16).view(torch.int16).item() & 0xFFFF


def _e4m3(code: int) -> float:
    return torch.tensor([code], dtype=torch.uint8).view(torch.float8_e4m3fn).double().item()


def _expected(word: int, s: int) -> list[int]:
    vals = [_e4m3((word >> (8 * i)) & 0xFF) * 2.0 ** (s - 127) for i in range(4)]
    return [_bf16_bits(vals[0]) | (_bf16_bits(vals[1]) << 16), _bf16_bits(vals[2]) | (_bf16_bits(vals[3]) << 16)]


def _scale_operand(s: int, safe: bool) -> int:
    bits = (64 if s == 0 else s << 7) if safe else (s + 120) << 7  # as the kernel builds them
    return bits | (bits << 16)


FINITE = [c for c in range(256) if c & 0x7F != 0x7F]


def _words(rng: random.Random, n: int) -> list[int]:
    return [sum(rng.choice(FINITE) << (8 * i) for i in range(4)) for _ in range(n)]


def test_every_code_exact_with_two_multiplies():
    rng = random.Random(0)
    # every finite code once in every byte slot, then random words
    words = [sum(FINITE[(i + 61 * j) % len(FINITE)] << (8 * j) for j in range(4)) for i in range(len(FINITE))]
    for s in [0, 1, 2, 3, 60, 119, 120, 127, 134, 135, 200, 240]:
        for w in words[::7] + _words(rng, 8):
            assert gg.decode_word_reference(w, _scale_operand(s, True), safe=True) == _expected(w, s), (hex(w), s)


def test_one_multiply_form_exact_up_to_scale_134():
    rng = random.Random(1)
    words = [sum(FINITE[(i + 61 * j) % len(FINITE)] << (8 * j) for j in range(4)) for i in range(len(FINITE))]
    for s in range(0, 135):
        for w in (words if s in (0, 7, 119, 134) else _words(rng, 6)):
            assert gg.decode_word_reference(w, _scale_operand(s, False), safe=False) == _expected(w, s), (hex(w), s)


def test_k_order_contract():
    """Thread c's word j decodes to (b0, b1), (b2, b3) = the fragment's K 16j + 2c + {0, 1} and 16j + 8 + 2c +
    {0, 1}; ``_decode``'s reshape/permute labels them so, and ``permute_x`` puts x's columns in that order."""
    phys = torch.arange(128).reshape(4, 32)  # [c, 4j + t]: the byte each decoded element came from (natural)
    logical = phys.reshape(4, 8, 2, 2).permute(1, 2, 0, 3).reshape(128)  # _decode: [c, j, h, e] -> (j, h, c, e)
    for c in range(4):
        for j in range(8):
            for t in range(4):
                assert logical[16 * j + 8 * (t // 2) + 2 * c + t % 2] == 32 * c + 4 * j + t
    if gg.available():  # the kernel's own gather formula (plain arithmetic) reads the same columns
        assert torch.equal(gg._x_column.fn(torch.arange(128)), logical)
    x = torch.arange(256.0).reshape(1, 256)
    xp = gg.permute_x(x)
    assert torch.equal(xp[0, :128], logical.double().float()) and torch.equal(xp[0, 128:], logical.float() + 128)
    w = torch.randn(3, 256, dtype=torch.float64)
    wl = torch.cat([w[:, :128][:, logical], w[:, 128:][:, logical]], 1)  # the weights as the MMA sees them
    xr = torch.randn(2, 256, dtype=torch.float64)
    assert torch.allclose(gg.permute_x(xr) @ wl.t(), xr @ w.t())


def test_scale_check_on_inference_tensors():
    """Weights loaded under ``torch.inference_mode`` have no version counter: the cached scale check must still
    answer (the first V4.1 sweep on the H200 stopped here), and see a byte above the limit."""
    with torch.inference_mode():
        ok = torch.full((4, 8), 134, dtype=torch.uint8)
        bad = ok.clone()
        bad[2, 3] = 135
    assert gg.scales_allow_fast(ok) and not gg.scales_allow_fast(bad)
    assert gg.scales_allow_fast(ok)  # the cached answer


def test_scale_check_caches_fresh_views_of_one_stack():
    """``gemm.fp8_block`` hands the check a new ``scale.view(torch.uint8)`` on every call. The cache must still
    hit (keyed to the view's base): a miss costs a host read per call in eager steps, and inside a CUDA graph
    capture it answered False, so graphs ran the slower exact decode and compiled it mid-capture, which failed
    the capture now and then on the H200 (thirteenth pass)."""
    from deepinfer_nvidia.kernels import scale_checks as sw

    with torch.inference_mode():
        stack = torch.full((4, 8), 130, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    sw._SAFE_CACHE.clear()
    assert gg.scales_allow_fast(stack.view(torch.uint8))
    reads = []
    real_view = torch.Tensor.view

    def counting_view(self, *args):
        if args == (torch.uint8,) and self.data_ptr() == stack.data_ptr():
            reads.append(1)
        return real_view(self, *args)

    torch.Tensor.view = counting_view
    try:
        for _ in range(3):  # fresh views, the weights unchanged: answered from the cache, no host read
            assert gg.scales_allow_fast(real_view(stack, torch.uint8))
    finally:
        torch.Tensor.view = real_view
    assert reads == [] and len(sw._SAFE_CACHE) == 1
    other = torch.full((4, 8), 200, dtype=torch.uint8)  # another stack: its own check
    assert not gg.scales_allow_fast(other.view(torch.uint8))


def test_scale_check_sees_a_new_stack_in_freed_memory():
    """A stack freed and another allocated (perhaps at the same address, same size): checked anew."""
    for _ in range(5):
        good = torch.full((64, 64), 120, dtype=torch.uint8)
        assert gg.scales_allow_fast(good.view(torch.uint8))
        del good
        bad = torch.full((64, 64), 150, dtype=torch.uint8)
        assert not gg.scales_allow_fast(bad.view(torch.uint8))
        del bad


@pytest.mark.parametrize("tma", [True, False])
def test_tma_wiring_of_the_gemv_launch(monkeypatch, tma):
    """``gemv_wgmma(tma=True)`` passes TMA=1 and q's descriptor ([N, K/32, 32] bytes, boxes [64, 4, 32]);
    ``tma=False`` passes neither. The kernel is recorded, not launched (no GPU here)."""
    from deepinfer_nvidia.kernels import gluon_fp8_gemv as gg

    calls = []

    class Rec:
        def __getitem__(self, grid):
            return lambda *args, **kw: calls.append((grid, args, kw))

    monkeypatch.setattr(gg, "_wgmma_gemv_kernel", Rec())
    x = torch.randn(2, 512).bfloat16()
    q = torch.randint(0, 120, (256, 512), dtype=torch.uint8).view(torch.float8_e4m3fn)
    s = torch.full((2, 4), 127, dtype=torch.uint8)
    gg.gemv_wgmma(x, q, s, 4, 128, 128, 132, tma=tma, safe=False, pdl=False)
    (_, _, kw), = calls
    assert kw["TMA"] == int(tma)
    if tma:
        d = kw["q_desc"]
        assert d.base.data_ptr() == q.data_ptr()
        assert list(d.shape) == [256, 16, 32] and list(d.block_shape) == [64, 4, 32]
    else:
        assert kw["q_desc"] is None


def test_split_fits_one_wave_of_resident_programs():
    """``split_k_tiles`` on 132 SMs at 4 programs an SM: V4.1's GEMVs keep their splits except wq_b, whose
    2 splits (1024 programs) would need 1.11 waves of 7 resident programs; every split covers K once."""
    cases = {"wq_a": (20, 40, 2), "wq_b": (512, 10, 10), "wkv": (8, 40, 2), "wo_a": (16, 32, 1), "wo_b": (80, 64, 8),
             "idx_wq_b": (64, 10, 2), "shared_w13": (36, 40, 3), "shared_w2": (80, 18, 3)}
    for name, (tiles, k_tiles, per) in cases.items():
        assert gg.split_k_tiles(tiles, k_tiles, 132, 4, 7) == per, name
    assert gg.split_k_tiles(512, 10, 132, 4, 0) == 5  # no cap: 2 splits of 5 tiles
    for tiles in (1, 7, 64, 300, 1000):
        for k_tiles in (1, 3, 10, 40, 130):
            per = gg.split_k_tiles(tiles, k_tiles, 132, 4, 7)
            split = -(-k_tiles // per)
            assert 1 <= per <= k_tiles and (split - 1) * per < k_tiles <= split * per
            assert split == 1 or tiles * split <= 7 * 132


def test_thirty_two_rows_behind_the_knob(monkeypatch):
    """``max_rows`` 32 (``DEEPINFER_NV_WGMMA_GEMV_ROWS=32``, prepared, off by default): 17-32 rows launch with 32
    activation rows as the wgmma's N and the one-wave split cap of ``RESIDENT_32`` programs an SM (48 KB of shared
    memory a program); 9-16 rows keep 16 and the default cap; the default (16) does not take 17 rows."""
    from deepinfer_nvidia.kernels import gluon_fp8_gemv as gg

    assert gg.WGMMA_GEMV_TUNE["max_rows"] == 16  # the default until the device measures 32
    calls = []

    class Rec:
        def __getitem__(self, grid):
            return lambda *args, **kw: calls.append((grid, args, kw))

    monkeypatch.setattr(gg, "_wgmma_gemv_kernel", Rec())
    monkeypatch.setattr(gg, "split_k_tiles", lambda tiles, k_tiles, sms, programs, resident: calls.append(resident)
                        or k_tiles)
    q = torch.randint(0, 120, (256, 512), dtype=torch.uint8).view(torch.float8_e4m3fn)
    s = torch.full((2, 4), 127, dtype=torch.uint8)
    for m, block_m, resident in ((20, 32, gg.RESIDENT_32), (32, 32, gg.RESIDENT_32), (12, 16, 7), (3, 8, 7)):
        calls.clear()
        gg.gemv_wgmma(torch.randn(m, 512).bfloat16(), q, s, 4, 128, 128, 132, safe=False, pdl=False)
        cap, (_, _, kw) = calls
        assert kw["BLOCK_M"] == block_m and cap == resident, (m, kw["BLOCK_M"], cap)
    x = torch.randn(17, 512).bfloat16()
    monkeypatch.setattr(gg, "_sm90", lambda dev: True)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    assert not gg.takes(x, q, 128, 128, True)
    monkeypatch.setitem(gg.WGMMA_GEMV_TUNE, "max_rows", 32)
    assert gg.takes(x, q, 128, 128, True) == gg.available()
    assert not gg.takes(torch.randn(33, 512).bfloat16(), q, 128, 128, True)
