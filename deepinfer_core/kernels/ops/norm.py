"""RMSNorm references (weighted and weightless), computed in fp32, and ``norm.rms_rope`` (RMSNorm, then the
interleaved RoPE of ``rope.interleaved``: a fused op, ``OpSpec.components``)."""
from __future__ import annotations

import torch

from deepinfer_core.kernels.ops.rope import apply_rope, default_inv_freq
from deepinfer_core.kernels.spec import OpSpec, acc


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Weighted RMSNorm over the last dim. x [..., N] any float dtype, weight [N].

    ``y = w * x / sqrt(mean(x^2) + eps)`` in fp32, cast back to ``x.dtype``.
    """
    xf = acc(x)
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (acc(weight) * y).to(x.dtype)


def rms_norm_unweighted(x: torch.Tensor, eps: float) -> torch.Tensor:
    """Weightless RMSNorm over the last dim: ``x * rsqrt(mean(x^2) + eps)`` (scale in fp32)."""
    return x * torch.rsqrt(acc(x).pow(2).mean(-1, keepdim=True) + eps).to(x.dtype)


RMS_ROPE_PARTS = ("norm.rms", "rope.interleaved")


def compose_rms_rope(k: dict):
    """``norm.rms_rope`` from its parts ``k`` (``{op: callable}`` for ``RMS_ROPE_PARTS``)."""
    rms, rope = k["norm.rms"], k["rope.interleaved"]

    def rms_rope(x: torch.Tensor, weight: torch.Tensor, eps: float, positions: torch.Tensor,
                 inv_freq: torch.Tensor) -> torch.Tensor:
        """x [T, ..., N], weight [N], positions [T] int, inv_freq [R/2] fp32 -> ``rope.interleaved(norm.rms(x,
        weight, eps), positions, inv_freq)`` in x.dtype: the normed vector (rounded to x.dtype), its last R
        channels rotated (a KV row, a compressed entry, an index key)."""
        return rope(rms(x, weight, eps), positions, inv_freq)

    return rms_rope


def _gen_rms_rope(dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    for t, n, rd in [(1, 512, 64), (5, 512, 64), (3, 128, 64), (7, 96, 16)]:
        x = (3 * torch.randn(t, n, generator=g)).to(dtype).to(device)
        w = (1 + 0.1 * torch.randn(n, generator=g)).float().to(device)
        pos = torch.randint(0, 70000, (t,), generator=g).to(device)
        yield (x, w, 1e-6, pos, default_inv_freq(rd, 10000.0).to(device)), {}


def _gen_rms(dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    for shape in [(1, 8), (7, 64), (33, 512), (3, 5, 1280)]:
        x = torch.randn(*shape, generator=g).to(dtype).to(device)
        w = (1 + 0.1 * torch.randn(shape[-1], generator=g)).float().to(device)
        yield (x, w, 1e-6), {}


def _gen_rms_unweighted(dtype, device, seed):
    for (x, _w, eps), kw in _gen_rms(dtype, device, seed):
        yield (x, eps), kw


rms_rope = compose_rms_rope({"norm.rms": rms_norm, "rope.interleaved": apply_rope})

OPS = [
    OpSpec("norm.rms", rms_norm, _gen_rms, doc="weighted RMSNorm"),
    OpSpec("norm.rms_rope", rms_rope, _gen_rms_rope, tolerances={torch.bfloat16: (3e-2, 3e-2)},
           components=RMS_ROPE_PARTS, compose=compose_rms_rope, doc="norm.rms, then rope.interleaved"),
    OpSpec("norm.rms_unweighted", rms_norm_unweighted, _gen_rms_unweighted, doc="weightless RMSNorm"),
]
