"""RMSNorm references (weighted and weightless), computed in fp32."""
from __future__ import annotations

import torch

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


def _gen_rms(dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    for shape in [(1, 8), (7, 64), (33, 512), (3, 5, 1280)]:
        x = torch.randn(*shape, generator=g).to(dtype).to(device)
        w = (1 + 0.1 * torch.randn(shape[-1], generator=g)).float().to(device)
        yield (x, w, 1e-6), {}


def _gen_rms_unweighted(dtype, device, seed):
    for (x, _w, eps), kw in _gen_rms(dtype, device, seed):
        yield (x, eps), kw


OPS = [
    OpSpec("norm.rms", rms_norm, _gen_rms, doc="weighted RMSNorm"),
    OpSpec("norm.rms_unweighted", rms_norm_unweighted, _gen_rms_unweighted, doc="weightless RMSNorm"),
]
