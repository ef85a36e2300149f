"""Inputs shared by the MoE expert kernels' interpreter tests (imported inside their interpreted scripts, which run
from the repository root): MXFP4 expert stacks and routings, drawn from the caller's generator in a fixed order."""
from __future__ import annotations

import torch

from deepinfer_core.kernels.ops.quant import quant_mxfp4


def mxfp4_experts(g: torch.Generator, e: int, d: int, f: int) -> list[torch.Tensor]:
    """``[w1, s1, w3, s3, w2, s2]`` for ``e`` experts of hidden ``d`` and inner ``f``: packed uint8 [E, rows, cols/2]
    and UE8M0 scales [E, rows, cols/32] of random weights scaled by 1/sqrt(cols)."""
    def stack(rows, cols):
        q = [quant_mxfp4(torch.randn(rows, cols, generator=g) / cols ** 0.5) for _ in range(e)]
        return [torch.stack([a for a, _ in q]), torch.stack([b for _, b in q])]

    return stack(f, d) + stack(f, d) + stack(d, f)


def routing(g: torch.Generator, t: int, k: int, e: int, route: str) -> torch.Tensor:
    """Expert ids [t, k] int64: ``"one"`` puts every pair on the last expert, ``"rand"`` draws k distinct experts a
    token."""
    if route == "one":
        return torch.full((t, k), e - 1, dtype=torch.long)
    return torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
