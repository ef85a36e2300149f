"""Interleaved RoPE on the tail of each head (DeepSeek-V4 layout).

The last ``2*len(inv_freq)`` channels of each vector are rotated as adjacent
pairs ``(2i, 2i+1)`` (GPT-J style): ``(a, b) -> (a cos - b sin, b cos + a sin)``
with angle ``position * inv_freq[i]``, computed in fp32. ``inverse=True``
rotates by the negative angle (used on the attention output).
"""
from __future__ import annotations

import math

import torch

from deepinfer_core.kernels.spec import OpSpec, acc


def default_inv_freq(rope_dim: int, base: float) -> torch.Tensor:
    """``base ** (-2i / rope_dim)`` for i < rope_dim/2, fp32 [rope_dim/2]."""
    return 1.0 / (base ** (torch.arange(0, rope_dim, 2, dtype=torch.float32) / rope_dim))


def yarn_inv_freq(rope_dim: int, base: float, factor: float, original_max_pos: int,
                  beta_fast: float = 32.0, beta_slow: float = 1.0) -> torch.Tensor:
    """YaRN frequency interpolation without magnitude scaling (V4 compress rope).

    ``f' = (f / factor) * ramp + f * (1 - ramp)`` with the ramp between the
    correction dims of ``beta_fast`` and ``beta_slow`` (floor / ceil, clamped to
    [0, rope_dim-1]).
    """
    f = default_inv_freq(rope_dim, base)

    def corr_dim(rot: float) -> float:
        return rope_dim * math.log(original_max_pos / (rot * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(corr_dim(beta_fast)), 0)
    high = min(math.ceil(corr_dim(beta_slow)), rope_dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(rope_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    return (f / factor) * ramp + f * (1 - ramp)


def apply_rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """Rotate the tail of x. x [T, ..., D]; positions [T] int; inv_freq [R/2] fp32. Returns x.dtype.

    The rotation is computed in fp32 and the rotated slice cast back to x.dtype.
    """
    half = inv_freq.shape[0]
    rd = 2 * half
    ct = torch.float64 if x.dtype == torch.float64 else torch.float32
    # angles and cos/sin in fp64 (see linalg.up): position-exact and batch-invariant
    ang = positions.to(torch.float64)[:, None] * inv_freq.to(device=x.device, dtype=torch.float64)[None, :]
    cos, sin = ang.cos().to(ct), ang.sin().to(ct)
    if inverse:
        sin = -sin
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (half,)
    cos, sin = cos.view(shape), sin.view(shape)
    tail = acc(x[..., -rd:])
    a, b = tail[..., 0::2], tail[..., 1::2]
    ra = a * cos - b * sin
    rb = b * cos + a * sin
    rot = torch.stack((ra, rb), dim=-1).flatten(-2).to(x.dtype)
    return torch.cat([x[..., :-rd], rot], dim=-1)


def _gen_rope(dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    for t, h, d, rd in [(5, 1, 16, 8), (9, 4, 64, 16), (17, 8, 512, 64)]:
        x = torch.randn(t, h, d, generator=g).to(dtype).to(device)
        pos = torch.randint(0, 5000, (t,), generator=g).to(device)
        yield (x, pos, default_inv_freq(rd, 10000.0).to(device)), {}
        yield (x, pos, yarn_inv_freq(rd, 160000.0, 16.0, 65536).to(device)), {"inverse": True}


OPS = [OpSpec("rope.interleaved", apply_rope, _gen_rope, tolerances={torch.bfloat16: (3e-2, 3e-2)})]
