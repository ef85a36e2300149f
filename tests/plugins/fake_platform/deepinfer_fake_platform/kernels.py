"""The fake provider's ``norm.rms``: a genuinely different implementation.

It computes in float64 and divides by the root mean square instead of
multiplying by ``rsqrt`` as the reference does, so conformance against the
reference is a real check, not an identity.
"""
from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Weighted RMSNorm over the last dim. x [..., N] float, weight [N]; returns x.dtype."""
    xd = x.to(torch.float64)
    rms = torch.sqrt(torch.mean(xd * xd, dim=-1, keepdim=True) + eps)
    return (xd / rms * weight.to(torch.float64)).to(x.dtype)
