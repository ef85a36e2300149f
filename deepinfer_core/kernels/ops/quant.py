"""Weight quantisation formats of DeepSeek checkpoints: FP8 block and MXFP4.

Pure functions (torch only) that define the formats bit for bit; the GEMM
references in ``gemm.py`` and the checkpoint writer/loaders build on them.

- **UE8M0** scale: one byte ``b`` meaning ``2^(b-127)`` (``b == 255`` is NaN).
  Stored as ``torch.float8_e8m0fnu``; moving it through ``uint8`` must keep the
  raw byte (``.view``), never convert numerically (that would turn 2^-7 into 0).
- **FP8 block** linear ``[N, K]``: e4m3 values ``q`` and one scale per
  ``(bn, bk)`` block, ``W[n, k] = q[n, k] * s[n // bn, k // bk]``; edge blocks
  may be partial. Scales are fp32 (``amax / 448``) or UE8M0 (rounded up to a
  power of two so that ``|W| / s <= 448`` still holds).
- **MXFP4** ``[N, K]``: e2m1 nibbles, byte ``j`` of a row holds element ``2j``
  (low nibble) and ``2j+1`` (high nibble), one UE8M0 scale per 32 consecutive
  K-elements: ``W[n, k] = E2M1[nib] * 2^(s[n, k // 32] - 127)``.
"""
from __future__ import annotations

import torch

FP8_E4M3_MAX = 448.0
E2M1_MAX = 6.0
MXFP4_GROUP = 32
# Smallest amax that still gets a finite fp32 scale (serving stacks use the same floor).
FP8_AMAX_FLOOR = 1e-4

# Nibble code -> e2m1 value; codes 8..15 are the negatives (8 is -0).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
# Midpoints between consecutive magnitudes (codes i and i+1).
_E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


class QuantFormatError(ValueError):
    """A tensor does not match the quantisation format it is used with."""


# -- UE8M0 ---------------------------------------------------------------------
def _ue8m0_bytes(s: torch.Tensor, what: str = "scale") -> torch.Tensor:
    """Raw UE8M0 bytes (uint8) of a float8_e8m0fnu or uint8 tensor (no numeric conversion)."""
    if s.dtype == torch.float8_e8m0fnu:
        return s.view(torch.uint8)
    if s.dtype == torch.uint8:
        return s
    raise QuantFormatError(f"{what}: UE8M0 scales must be float8_e8m0fnu or uint8 raw bytes, got {s.dtype}")


def ue8m0_to_float(s: torch.Tensor) -> torch.Tensor:
    """UE8M0 byte ``b`` -> ``2^(b-127)`` as fp32 (same shape); byte 255 -> NaN.

    ``s``: float8_e8m0fnu, or uint8 holding the raw bytes.
    """
    b = _ue8m0_bytes(s).to(torch.int32)
    out = torch.ldexp(torch.ones_like(b, dtype=torch.float32), b - 127)
    return torch.where(b == 255, torch.full_like(out, float("nan")), out)


def _exponent_of_power_of_two(x: torch.Tensor) -> torch.Tensor:
    """Integer ``e`` with ``x == 2^e`` for fp32 ``x`` (caller checked x is a power of two)."""
    mantissa, exponent = torch.frexp(x)  # x = m * 2^e, m in [0.5, 1)
    return exponent.to(torch.int32) - 1


def float_to_ue8m0(x: torch.Tensor) -> torch.Tensor:
    """Exact powers of two ``2^e`` (e in [-127, 127]) -> float8_e8m0fnu (same shape).

    Raises ``QuantFormatError`` for non-powers of two, zeros, negatives and
    non-finite values instead of rounding them silently.
    """
    xf = x.float()
    mantissa, _ = torch.frexp(xf)
    bad = ~torch.isfinite(xf) | (xf <= 0) | (mantissa != 0.5)
    if bool(bad.any()):
        first = xf[bad].flatten()[0].item()
        raise QuantFormatError(f"float_to_ue8m0: {int(bad.sum())} value(s) are not positive powers of two "
                               f"(first: {first!r})")
    e = _exponent_of_power_of_two(xf)
    if bool(((e < -127) | (e > 127)).any()):
        raise QuantFormatError("float_to_ue8m0: exponent outside the UE8M0 range [-127, 127]")
    return (e + 127).to(torch.uint8).view(torch.float8_e8m0fnu)


def _ceil_pow2_exponent(x: torch.Tensor) -> torch.Tensor:
    """``ceil(log2(x))`` exactly, for positive finite fp32 ``x`` (int32)."""
    mantissa, exponent = torch.frexp(x)
    e = exponent.to(torch.int32)
    return torch.where(mantissa == 0.5, e - 1, e)


# -- FP8 activation rows (power-of-two scales) -----------------------------------------
def quant_rows_pow2(x: torch.Tensor, group: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (K a multiple of ``group``; any float dtype) -> (e4m3 [M, K], UE8M0 codes uint8 [M, K / group]): per
    row and group ``code = clamp(ceil(log2(amax / 448)) + 127, 0, 254)`` (MXFP8 at group 32, the quant spec's dynamic
    activations), values ``RNE(x / 2^(code - 127))``, so ``|x| / scale <= 448`` and nothing saturates. The ceiling is
    exact, from amax's bits rather than a rounded division: with amax = m * 2^e (1 <= m < 2) it is e - 8, plus 1 when
    m > 1.75 (448 = 1.75 * 2^8). An all-zero group gets code 0 and zeros."""
    m, k = x.shape
    xf = x.float().reshape(m, k // group, group)
    bits = xf.abs().amax(-1).view(torch.int32)
    c = ((bits >> 23) & 0xFF) - 135 + ((bits & 0x7FFFFF) > 0x600000).to(torch.int32)
    code = torch.clamp(c + 127, 0, 254)
    scale = torch.ldexp(torch.ones_like(xf[..., 0]), (code - 127).float())
    q = (xf / scale.unsqueeze(-1)).to(torch.float8_e4m3fn)
    return q.reshape(m, k), code.to(torch.uint8)


# -- FP8 block -------------------------------------------------------------------
def _check_block(block) -> tuple[int, int]:
    if not (isinstance(block, (tuple, list)) and len(block) == 2
            and all(isinstance(b, int) and b > 0 for b in block)):
        raise QuantFormatError(f"block must be two positive ints (bn, bk), got {block!r}")
    return int(block[0]), int(block[1])


def fp8_block_scale_shape(n: int, k: int, block) -> tuple[int, int]:
    """Shape ``[ceil(N/bn), ceil(K/bk)]`` of the block scales of an ``[N, K]`` weight."""
    bn, bk = _check_block(block)
    return -(-n // bn), -(-k // bk)


def _block_amax(w: torch.Tensor, bn: int, bk: int) -> torch.Tensor:
    """Per-block max |w| of fp32 ``w [N, K]`` -> ``[ceil(N/bn), ceil(K/bk)]`` (zero padding)."""
    n, k = w.shape
    sn, sk = -(-n // bn), -(-k // bk)
    padded = torch.zeros(sn * bn, sk * bk, dtype=torch.float32, device=w.device)
    padded[:n, :k] = w.abs()
    return padded.view(sn, bn, sk, bk).amax(dim=(1, 3))


def _expand_blocks(s: torch.Tensor, bn: int, bk: int, n: int, k: int) -> torch.Tensor:
    """Block scales ``[sn, sk]`` -> per-element ``[N, K]`` (edge blocks cut)."""
    return s.repeat_interleave(bn, dim=0)[:n].repeat_interleave(bk, dim=1)[:, :k]


def quant_fp8_block(w: torch.Tensor, block=(128, 128), scale_fmt: str | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise ``w [N, K]`` to e4m3 with one scale per ``(bn, bk)`` block.

    Returns ``(q float8_e4m3fn [N, K], scale [ceil(N/bn), ceil(K/bk)])`` where the
    scale is fp32 ``max(amax, 1e-4) / 448`` (``scale_fmt=None``) or that value
    rounded UP to a power of two as float8_e8m0fnu (``scale_fmt="ue8m0"``).
    Values are divided by the scale, clamped to +-448 and rounded to nearest e4m3.
    """
    if w.dim() != 2:
        raise QuantFormatError(f"quant_fp8_block expects a 2-D weight [N, K], got shape {tuple(w.shape)}")
    if not w.is_floating_point():
        raise QuantFormatError(f"quant_fp8_block expects a float weight, got {w.dtype}")
    if scale_fmt not in (None, "ue8m0"):
        raise QuantFormatError(f"scale_fmt must be None or 'ue8m0', got {scale_fmt!r}")
    bn, bk = _check_block(block)
    wf = w.float()
    if not bool(torch.isfinite(wf).all()):
        raise QuantFormatError("quant_fp8_block: weight has non-finite values")
    n, k = wf.shape
    scale = _block_amax(wf, bn, bk).clamp_min(FP8_AMAX_FLOOR) / FP8_E4M3_MAX
    if scale_fmt == "ue8m0":
        e = _ceil_pow2_exponent(scale).clamp(-127, 127)
        scale = torch.ldexp(torch.ones_like(scale), e)
        stored = (e + 127).to(torch.uint8).view(torch.float8_e8m0fnu)
    else:
        stored = scale
    q = (wf / _expand_blocks(scale, bn, bk, n, k)).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    return q, stored


def fp8_scale_to_float(scale: torch.Tensor) -> torch.Tensor:
    """Block scales as fp32: UE8M0 (float8_e8m0fnu / uint8 raw bytes) decoded, floats upcast."""
    if scale.dtype in (torch.float8_e8m0fnu, torch.uint8):
        return ue8m0_to_float(scale)
    if scale.dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        return scale.float()
    raise QuantFormatError(f"fp8 block scale has unsupported dtype {scale.dtype}")


def dequant_fp8_block(q: torch.Tensor, scale: torch.Tensor, block=(128, 128)) -> torch.Tensor:
    """``q [N, K]`` (float8_e4m3fn) times its block scales -> fp32 ``[N, K]``.

    ``scale``: ``[ceil(N/bn), ceil(K/bk)]`` fp32 or UE8M0 (float8_e8m0fnu, or
    uint8 raw bytes). Partial edge blocks use their block's scale.
    """
    if q.dim() != 2:
        raise QuantFormatError(f"dequant_fp8_block expects q [N, K], got shape {tuple(q.shape)}")
    if q.dtype != torch.float8_e4m3fn:
        raise QuantFormatError(f"dequant_fp8_block expects q as float8_e4m3fn, got {q.dtype}")
    bn, bk = _check_block(block)
    n, k = q.shape
    want = fp8_block_scale_shape(n, k, (bn, bk))
    if tuple(scale.shape) != want:
        raise QuantFormatError(f"fp8 block scale for weight [{n}, {k}] with block ({bn}, {bk}) must have shape "
                               f"{list(want)}, got {list(scale.shape)}")
    return q.float() * _expand_blocks(fp8_scale_to_float(scale), bn, bk, n, k)


# -- MXFP4 -----------------------------------------------------------------------
_E2M1_LUTS: dict[torch.device, torch.Tensor] = {}


def _e2m1_lut(device) -> torch.Tensor:
    """The E2M1 code -> value table on ``device``, made once per device (so no host copy happens
    inside a captured graph after the warm-up)."""
    device = torch.device(device)
    lut = _E2M1_LUTS.get(device)
    if lut is None:
        lut = _E2M1_LUTS[device] = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=device)
    return lut


def _e2m1_encode(v: torch.Tensor) -> torch.Tensor:
    """Round fp32 ``v`` (already scaled into [-6, 6]) to the nearest e2m1 code (uint8 0..15).

    Ties go to the even code (round-half-to-even in the e2m1 grid); zero
    magnitudes encode as +0 (code 0).
    """
    a = v.abs()
    mids = torch.tensor(_E2M1_MIDPOINTS, dtype=torch.float32, device=v.device)
    code = (a.unsqueeze(-1) > mids).sum(-1).to(torch.int32)  # ties go to the lower code ...
    tie = (a.unsqueeze(-1) == mids).any(-1) & (code % 2 == 1)  # ... unless that code is odd
    code = code + tie.to(torch.int32)
    neg = (v < 0) & (code > 0)
    return (code + 8 * neg.to(torch.int32)).to(torch.uint8)


def quant_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise ``w [N, K]`` (K a multiple of 32) to MXFP4.

    Per group of 32 K-elements: ``scale = 2^ceil(log2(amax / 6))`` (amax floored
    at ``6 * 2^-126`` so all-zero groups get a valid scale), values ``w / scale``
    rounded to the nearest e2m1 value (ties to even).
    Returns ``(packed uint8 [N, K//2], scale float8_e8m0fnu [N, K//32])``.
    """
    if w.dim() != 2:
        raise QuantFormatError(f"quant_mxfp4 expects a 2-D weight [N, K], got shape {tuple(w.shape)}")
    if not w.is_floating_point():
        raise QuantFormatError(f"quant_mxfp4 expects a float weight, got {w.dtype}")
    n, k = w.shape
    if k % MXFP4_GROUP:
        raise QuantFormatError(f"quant_mxfp4 needs K divisible by {MXFP4_GROUP}, got K={k}")
    wf = w.float()
    if not bool(torch.isfinite(wf).all()):
        raise QuantFormatError("quant_mxfp4: weight has non-finite values")
    groups = wf.view(n, k // MXFP4_GROUP, MXFP4_GROUP)
    amax = groups.abs().amax(-1).clamp_min(E2M1_MAX * 2.0 ** -126)
    e = _ceil_pow2_exponent(amax / E2M1_MAX).clamp(-127, 127)
    scaled = groups / torch.ldexp(torch.ones_like(amax), e).unsqueeze(-1)
    codes = _e2m1_encode(scaled.clamp(-E2M1_MAX, E2M1_MAX)).view(n, k)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return packed.contiguous(), (e + 127).to(torch.uint8).view(torch.float8_e8m0fnu)


def dequant_mxfp4(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """MXFP4 ``packed [N, K//2]`` (uint8, or int8 reinterpreted as uint8) with
    ``scale [N, K//32]`` (float8_e8m0fnu or uint8 raw bytes) -> fp32 ``[N, K]``."""
    if packed.dim() != 2:
        raise QuantFormatError(f"dequant_mxfp4 expects packed [N, K/2], got shape {tuple(packed.shape)}")
    if packed.dtype == torch.int8:
        packed = packed.view(torch.uint8)  # same bits; signed storage is a checkpoint convention
    elif packed.dtype != torch.uint8:
        raise QuantFormatError(f"dequant_mxfp4 expects packed uint8/int8, got {packed.dtype}")
    n, half = packed.shape
    k = 2 * half
    if k % MXFP4_GROUP or tuple(scale.shape) != (n, k // MXFP4_GROUP):
        raise QuantFormatError(f"MXFP4 scale for packed [{n}, {half}] (K={k}) must have shape "
                               f"[{n}, {k // MXFP4_GROUP}] with K divisible by {MXFP4_GROUP}, got {list(scale.shape)}")
    lut = _e2m1_lut(packed.device)
    p = packed.to(torch.int64)
    vals = torch.stack((lut[p & 0xF], lut[p >> 4]), dim=-1).view(n, k)
    s = ue8m0_to_float(_ue8m0_bytes(scale, "MXFP4 scale"))
    return vals * s.repeat_interleave(MXFP4_GROUP, dim=1)


def mxfp4_grid_values() -> list[float]:
    """The 15 distinct e2m1 values (handy for building on-grid test weights)."""
    return sorted({abs(v) for v in E2M1_VALUES} | {-abs(v) for v in E2M1_VALUES if v})


__all__ = [
    "FP8_E4M3_MAX", "E2M1_VALUES", "MXFP4_GROUP", "QuantFormatError",
    "ue8m0_to_float", "float_to_ue8m0", "fp8_block_scale_shape", "fp8_scale_to_float",
    "quant_fp8_block", "dequant_fp8_block", "quant_mxfp4", "dequant_mxfp4", "mxfp4_grid_values",
]
