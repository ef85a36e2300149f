"""FP8-block / MXFP4 formats and the gemm.* references against float64 textbook math."""
from __future__ import annotations

import math

import pytest
import torch

from deepinfer_core.kernels.ops import gemm
from deepinfer_core.kernels.ops.quant import (
    E2M1_VALUES,
    QuantFormatError,
    dequant_fp8_block,
    dequant_mxfp4,
    float_to_ue8m0,
    quant_fp8_block,
    quant_mxfp4,
    quant_rows_pow2,
    ue8m0_to_float,
)
from deepinfer_core.kernels.registry import KernelRegistry

E2M1_POS = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


# -- textbook decoders (float64, element by element; independent of quant.py) ----------------
def _fp8_block_dense64(q: torch.Tensor, scale64: torch.Tensor, bn: int, bk: int) -> torch.Tensor:
    n, k = q.shape
    w = torch.empty(n, k, dtype=torch.float64)
    qd = q.to(torch.float64)
    for bi in range(scale64.shape[0]):
        for bj in range(scale64.shape[1]):
            w[bi * bn:(bi + 1) * bn, bj * bk:(bj + 1) * bk] = qd[bi * bn:(bi + 1) * bn, bj * bk:(bj + 1) * bk] * scale64[bi, bj]
    return w


def _mxfp4_dense64(packed: torch.Tensor, scale_bytes: torch.Tensor) -> torch.Tensor:
    n, half = packed.shape
    w = torch.empty(n, 2 * half, dtype=torch.float64)
    for r in range(n):
        for j in range(half):
            byte = int(packed[r, j])
            for idx, nib in ((2 * j, byte & 0xF), (2 * j + 1, byte >> 4)):
                mag = E2M1_POS[nib & 7]
                w[r, idx] = (-mag if nib & 8 else mag) * 2.0 ** (int(scale_bytes[r, idx // 32]) - 127)
    return w


# -- UE8M0 ----------------------------------------------------------------------------------
def test_ue8m0_to_float_every_byte():
    raw = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    got = ue8m0_to_float(raw)
    assert got.dtype == torch.float32
    for b in range(255):
        assert got[b].item() == 2.0 ** (b - 127), b
    assert math.isnan(got[255].item())
    assert torch.equal(ue8m0_to_float(raw.view(torch.float8_e8m0fnu))[:255], got[:255])


def test_ue8m0_raw_bytes_survive():
    s = float_to_ue8m0(torch.tensor([2.0 ** -7, 2.0 ** -127, 1.0, 2.0 ** 127]))
    assert s.dtype == torch.float8_e8m0fnu
    assert s.view(torch.uint8).tolist() == [120, 0, 127, 254]
    # A numeric conversion would destroy the small scale; our decoder reads the raw byte.
    assert s.to(torch.uint8)[0].item() == 0
    assert ue8m0_to_float(s)[0].item() == 2.0 ** -7
    assert ue8m0_to_float(s.view(torch.uint8))[0].item() == 2.0 ** -7


@pytest.mark.parametrize("bad", [3.0, 0.0, -2.0, float("inf"), float("nan")])
def test_float_to_ue8m0_rejects_non_powers_of_two(bad):
    with pytest.raises(QuantFormatError, match="power"):
        float_to_ue8m0(torch.tensor([1.0, bad]))


def test_ue8m0_rejects_other_dtypes():
    with pytest.raises(QuantFormatError, match="float8_e8m0fnu or uint8"):
        ue8m0_to_float(torch.ones(3))


# -- FP8 block --------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", [None, "ue8m0"])
@pytest.mark.parametrize("n,k,block", [(200, 300, (128, 128)), (64, 96, (32, 32)), (5, 7, (4, 8))])
def test_quant_fp8_block_scales_and_error_bound(n, k, block, fmt):
    g = torch.Generator().manual_seed(n * k)
    w = torch.randn(n, k, generator=g, dtype=torch.float64) * 0.05
    w[0, 0] = 3.0  # an outlier only its own block may see
    q, s = quant_fp8_block(w.float(), block, fmt)
    bn, bk = block
    assert q.dtype == torch.float8_e4m3fn and q.shape == (n, k)
    assert s.shape == (math.ceil(n / bn), math.ceil(k / bk))
    s64 = ue8m0_to_float(s).double() if fmt else s.double()
    assert s.dtype == (torch.float8_e8m0fnu if fmt else torch.float32)
    for bi in range(s.shape[0]):
        for bj in range(s.shape[1]):
            amax = w.float().double()[bi * bn:(bi + 1) * bn, bj * bk:(bj + 1) * bk].abs().max().item()
            want = max(amax, 1e-4) / 448
            if fmt:  # smallest power of two >= amax / 448
                assert s64[bi, bj] >= want * (1 - 1e-6) and s64[bi, bj] / 2 < want
                assert math.log2(s64[bi, bj]) == round(math.log2(s64[bi, bj]))
            else:
                assert s64[bi, bj].item() == pytest.approx(want, rel=1e-6)
    w64 = _fp8_block_dense64(q, s64, bn, bk)
    deq = dequant_fp8_block(q, s, block).double()
    if fmt:  # power-of-two scales: the fp32 product is exact
        assert torch.equal(deq, w64)
    else:  # one fp32 rounding of q * s
        torch.testing.assert_close(deq, w64, rtol=2.0 ** -23, atol=0)
    # e4m3: 3 mantissa bits (half-ulp 2^-4 relative), subnormal step 2^-9 (half 2^-10) times the scale
    per_elem_scale = s64.repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
    bound = torch.maximum(w.float().double().abs() * 2.0 ** -4, per_elem_scale * 2.0 ** -10)
    assert ((w64 - w.float().double()).abs() <= bound * (1 + 1e-9)).all()


@pytest.mark.parametrize("fmt", [None, "ue8m0"])
def test_fp8_block_exact_round_trip_on_grid(fmt):
    g = torch.Generator().manual_seed(1)
    n, k, block = 160, 200, (64, 64)
    raw = torch.randint(0, 256, (n, k), generator=g, dtype=torch.int32).to(torch.uint8)
    raw[(raw & 0x7F) == 0x7F] = 0x11  # drop NaN encodings
    q0 = raw.view(torch.float8_e4m3fn)
    for i in range(0, n, 64):
        for j in range(0, k, 64):
            q0[i, j] = 448.0  # each block's amax is exactly 448 * its scale
    s0 = torch.ldexp(torch.ones(3, 4), torch.randint(-20, 3, (3, 4), generator=g))
    w = dequant_fp8_block(q0, s0, block)
    q, s = quant_fp8_block(w, block, fmt)
    assert torch.equal(q.view(torch.uint8), q0.view(torch.uint8))
    assert torch.equal(ue8m0_to_float(s) if fmt else s, s0)
    assert torch.equal(dequant_fp8_block(q, s, block), w)


def test_dequant_fp8_block_accepts_raw_byte_scales_and_checks_shape():
    q, s = quant_fp8_block(torch.randn(40, 70) * 1e-3, (32, 32), "ue8m0")
    assert (s.view(torch.uint8) < 127 - 7).all()  # genuinely small scales
    assert torch.equal(dequant_fp8_block(q, s, (32, 32)), dequant_fp8_block(q, s.view(torch.uint8), (32, 32)))
    with pytest.raises(QuantFormatError, match=r"must have shape \[2, 3\]"):
        dequant_fp8_block(q, torch.ones(2, 2), (32, 32))
    with pytest.raises(QuantFormatError, match="float8_e4m3fn"):
        dequant_fp8_block(q.float(), s, (32, 32))


# -- MXFP4 ------------------------------------------------------------------------------------
def test_mxfp4_nibble_order_and_lut():
    lo, hi = torch.meshgrid(torch.arange(16), torch.arange(16), indexing="ij")
    packed = (lo | (hi << 4)).to(torch.uint8).reshape(16, 16)  # row r: lo = r, hi = 0..15
    scale = torch.full((16, 1), 127, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    w = dequant_mxfp4(packed, scale)
    assert w.shape == (16, 32)
    for r in range(16):
        assert (w[r, 0::2] == E2M1_VALUES[r]).all()  # element 2j = low nibble
        assert w[r, 1::2].tolist() == list(E2M1_VALUES)  # element 2j+1 = high nibble
    assert torch.equal(dequant_mxfp4(packed.view(torch.int8), scale), w)


def test_quant_mxfp4_matches_nearest_grid_value():
    g = torch.Generator().manual_seed(3)
    w = torch.randn(12, 128, generator=g) * torch.logspace(-3, 1, 12).unsqueeze(1)
    packed, scale = quant_mxfp4(w)
    assert packed.dtype == torch.uint8 and packed.shape == (12, 64)
    assert scale.dtype == torch.float8_e8m0fnu and scale.shape == (12, 4)
    deq64 = _mxfp4_dense64(packed, scale.view(torch.uint8))
    assert torch.equal(dequant_mxfp4(packed, scale).double(), deq64)
    grid = torch.tensor(sorted({v for v in E2M1_VALUES} | {-v for v in E2M1_VALUES}), dtype=torch.float64)
    w64 = w.double()
    for r in range(12):
        for c in range(4):
            grp = w64[r, c * 32:(c + 1) * 32]
            s = 2.0 ** math.ceil(math.log2(grp.abs().max().item() / 6))
            assert ue8m0_to_float(scale)[r, c].item() == s
            v = grp / s
            best = (v.unsqueeze(1) - grid).abs().min(1).values
            assert torch.allclose((deq64[r, c * 32:(c + 1) * 32] / s - v).abs(), best, rtol=0, atol=1e-12)


def test_quant_mxfp4_ties_to_even_and_exact_round_trip():
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.75, -5.0])
    w = torch.zeros(1, 32)
    w[0, :9] = ties
    w[0, 31] = 6.0  # pins the scale to 1
    packed, scale = quant_mxfp4(w)
    assert dequant_mxfp4(packed, scale)[0, :9].tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -1.0, -4.0]
    # values already on the grid (with a +-6 per group) come back bit-exactly
    g = torch.Generator().manual_seed(4)
    lut = torch.tensor(E2M1_VALUES)
    vals = lut[torch.randint(0, 16, (8, 96), generator=g)]
    vals[:, ::32] = 6.0
    e = torch.randint(-30, 10, (8, 3), generator=g)
    w = vals * torch.ldexp(torch.ones(8, 3), e).repeat_interleave(32, 1)
    packed, scale = quant_mxfp4(w)
    assert torch.equal(scale.view(torch.uint8).long(), e + 127)
    assert torch.equal(dequant_mxfp4(packed, scale), w)


def test_mxfp4_errors():
    with pytest.raises(QuantFormatError, match="divisible by 32"):
        quant_mxfp4(torch.randn(4, 48))
    packed, scale = quant_mxfp4(torch.randn(4, 64))
    with pytest.raises(QuantFormatError, match=r"\[4, 2\]"):
        dequant_mxfp4(packed, scale[:, :1])
    with pytest.raises(QuantFormatError, match="uint8/int8"):
        dequant_mxfp4(packed.float(), scale)


# -- gemm references vs float64 ---------------------------------------------------------------
def test_gemm_dense_vs_float64():
    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(7, 48, generator=g), torch.randn(24, 48, generator=g).to(torch.bfloat16)
    y = gemm.dense(x, w)
    assert y.dtype == torch.float32 and y.shape == (7, 24)
    torch.testing.assert_close(y.double(), x.double() @ w.double().T, atol=1e-5, rtol=1e-5)
    assert gemm.dense(x.to(torch.bfloat16), w).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="K=48"):
        gemm.dense(torch.randn(2, 40), w)


@pytest.mark.parametrize("fmt,block", [(None, (128, 128)), ("ue8m0", (32, 32))])
def test_gemm_fp8_block_vs_float64(fmt, block):
    g = torch.Generator().manual_seed(6)
    x = torch.randn(9, 300, generator=g)
    q, s = quant_fp8_block(torch.randn(200, 300, generator=g) / 17, block, fmt)
    s64 = ue8m0_to_float(s).double() if fmt else s.double()
    want = x.double() @ _fp8_block_dense64(q, s64, *block).T
    y = gemm.fp8_block(x, q, s, block)
    assert y.dtype == torch.float32 and y.shape == (9, 200)
    torch.testing.assert_close(y.double(), want, atol=1e-4, rtol=1e-5)
    yb = gemm.fp8_block(x.to(torch.bfloat16), q, s, block)
    assert yb.dtype == torch.bfloat16
    torch.testing.assert_close(yb.double(), want, atol=0.1, rtol=0.05)


@pytest.mark.parametrize("fmt,block", [(None, (128, 128)), ("ue8m0", (32, 32))])
def test_gemm_fp8_block_grouped_vs_float64(fmt, block):
    """Column group g of x times weight rows g*Ng..(g+1)*Ng (V4's grouped wo_a), against float64 per group."""
    g = torch.Generator().manual_seed(8)
    groups, ng, kg = 3, block[0] * 2, 96
    x = torch.randn(4, groups * kg, generator=g)
    q, s = quant_fp8_block(torch.randn(groups * ng, kg, generator=g) / 10, block, fmt)
    s64 = ue8m0_to_float(s).double() if fmt else s.double()
    w64 = _fp8_block_dense64(q, s64, *block)
    want = torch.cat([x[:, i * kg:(i + 1) * kg].double() @ w64[i * ng:(i + 1) * ng].T for i in range(groups)], -1)
    y = gemm.fp8_block_grouped(x, q, s, block, groups)
    assert y.shape == (4, groups * ng) and y.dtype == torch.float32
    torch.testing.assert_close(y.double(), want, atol=1e-4, rtol=1e-5)


def test_gemm_fp8_block_grouped_errors():
    q, s = quant_fp8_block(torch.randn(96, 64), (32, 32), "ue8m0")
    x = torch.randn(2, 4 * 64)
    with pytest.raises(ValueError, match="do not split into 5 groups"):
        gemm.fp8_block_grouped(x[:, :5 * 64], q, s, (32, 32), 5)
    with pytest.raises(ValueError, match="group rows 24 are not a multiple of the scale block 32"):
        gemm.fp8_block_grouped(x, q, s, (32, 32), 4)
    q3, s3 = quant_fp8_block(torch.randn(96, 64), (32, 32), "ue8m0")
    with pytest.raises(ValueError, match="K=256 but the weight has K=192"):
        gemm.fp8_block_grouped(x, q3, s3, (32, 32), 3)


def test_gemm_mxfp4_vs_float64():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(5, 64, generator=g)
    packed, s = quant_mxfp4(torch.randn(40, 64, generator=g) / 8)
    want = x.double() @ _mxfp4_dense64(packed, s.view(torch.uint8)).T
    y = gemm.mxfp4(x, packed, s)
    assert y.shape == (5, 40)
    torch.testing.assert_close(y.double(), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gemm.mxfp4(x, packed.view(torch.int8), s), y)


def test_gemm_ops_register_and_run_their_inputs():
    reg = KernelRegistry()
    for spec in gemm.OPS:
        reg.register_op(spec)
    assert reg.ops() == ["gemm.dense", "gemm.dense_wide", "gemm.fp8_block", "gemm.fp8_block_grouped", "gemm.mxfp4"]
    for spec in gemm.OPS:
        for dtype in (torch.float32, torch.bfloat16):
            cases = list(spec.input_gen(dtype, "cpu", 0))
            assert cases
            for args, kwargs in cases:
                y = spec.reference(*args, **kwargs)
                x = args[0]
                want = gemm.wide_dtype(args[1]) if spec.name == "gemm.dense_wide" else dtype  # dense_wide: fp32
                assert y.dtype == want and y.shape[0] == x.shape[0] and torch.isfinite(y).all()


def test_dense_wide_is_dense_of_x_cast_to_the_weights_dtype():
    """``gemm.dense_wide(x, w)`` is ``gemm.dense(x.to(w.dtype), w)`` bit for bit (bf16 and fp64 activations on fp32
    router-like weights), in w's dtype; a bf16 weight (as a checkpoint stores it) is widened to fp32 with x, the
    same product as its fp32 copy's; bad operands raise naming the op."""
    g = torch.Generator().manual_seed(7)
    w = (torch.randn(384, 512, generator=g) / 20).bfloat16().float()
    for x in (torch.randn(3, 512, generator=g).bfloat16(), torch.randn(2, 512, generator=g, dtype=torch.float64)):
        y = gemm.dense_wide(x, w)
        assert y.dtype == torch.float32 and torch.equal(y, gemm.dense(x.float(), w))
        half = gemm.dense_wide(x, w.bfloat16())
        assert half.dtype == torch.float32 and torch.equal(half, y)
    assert gemm.wide_dtype(w.double()) == torch.float64 and gemm.wide_dtype(w.half()) == torch.float32
    with pytest.raises(ValueError, match="gemm.dense_wide"):
        gemm.dense_wide(torch.randn(3, 500), w)
    with pytest.raises(TypeError, match="gemm.dense_wide"):
        gemm.dense_wide(torch.randn(3, 512), torch.ones(4, 512, dtype=torch.int32))


# -- FP8 activation rows with power-of-two scales (MXFP8 at 32 columns) ---------------------------------
def _vllm_codes(amax: torch.Tensor) -> torch.Tensor:
    """The code formula of the quant spec, in float64 (MODEL_SPEC 3.11)."""
    out = []
    for a in amax.double().tolist():
        c = math.ceil(math.log2(a / 448.0)) if a > 0 else -1000
        out.append(min(max(c + 127, 0), 254))
    return torch.tensor(out, dtype=torch.uint8)


@pytest.mark.parametrize("group", [32, 128])
def test_rows_pow2_codes_match_the_spec_formula(group):
    g = torch.Generator().manual_seed(0)
    amax = torch.cat([torch.rand(2000, generator=g) * torch.exp2(torch.randint(-60, 60, (2000,), generator=g).float()),
                      448.0 * torch.exp2(torch.arange(-20, 20).float()),  # amax / 448 a power of two
                      torch.exp2(torch.arange(-20, 20).float()),
                      torch.tensor([0.0, 1e-45, 3e38])])
    x = torch.zeros(amax.numel(), group)
    x[:, 5] = -amax  # the block's amax, negative
    x[:, 9] = amax * 0.3
    q, code = quant_rows_pow2(x, group)
    assert torch.equal(code[:, 0], _vllm_codes(amax))
    assert q.float().abs().max() <= 448


@pytest.mark.parametrize("group", [32, 128])
def test_rows_pow2_round_trip_within_half_a_step(group):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(16, 512, generator=g) * torch.exp2(torch.linspace(-30, 30, 512))
    x[3, 2 * group:3 * group] = 0
    q, code = quant_rows_pow2(x.bfloat16(), group)
    scale = torch.ldexp(torch.ones(16, 512 // group), code.float() - 127).repeat_interleave(group, 1)
    back = q.float() * scale
    xb = x.bfloat16().float()
    # e4m3 keeps 3 mantissa bits: half a step is 2^-4 of the value (normals), 2^-10 of the scale (subnormals)
    assert ((back - xb).abs() <= torch.maximum(xb.abs() * 2 ** -4, scale * 2 ** -10)).all()
    assert code[3, 2] == 0 and not back[3, 2 * group:3 * group].any()
