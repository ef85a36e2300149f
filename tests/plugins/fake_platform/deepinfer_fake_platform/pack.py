"""An add-on kernel pack (entry-point group ``deepinfer.kernels``): adds a provider only."""
from __future__ import annotations

from typing import Any

import torch


def rms_norm_unweighted(x: torch.Tensor, eps: float) -> torch.Tensor:
    """Weightless RMSNorm over the last dim, computed in float64. x [..., N] float."""
    xd = x.to(torch.float64)
    return (xd / torch.sqrt(xd.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def register(registry: Any) -> None:
    registry.register_impl("norm.rms_unweighted", "fake_pack", "deepinfer_fake_platform.pack:rms_norm_unweighted")
