"""Token bitmask application for structured outputs."""
from __future__ import annotations

import torch

from deepinfer_core.kernels.spec import OpSpec


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """Set disallowed logits to -inf. logits [B, V] float; bitmask int32 [B, ceil(V/32)]
    (bit j of word w allows token 32*w + j; tokens past V are ignored). Returns a new tensor.
    """
    b, v = logits.shape
    words = bitmask.to(device=logits.device, dtype=torch.int32)
    bits = (words.unsqueeze(-1) >> torch.arange(32, device=logits.device, dtype=torch.int32)) & 1
    allowed = bits.reshape(b, -1)[:, :v].bool()
    return logits.masked_fill(~allowed, float("-inf"))


def _gen(dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    for b, v in [(1, 40), (4, 129280), (3, 33)]:
        logits = torch.randn(b, v, generator=g).to(dtype).to(device)
        mask = torch.randint(-(2 ** 31), 2 ** 31 - 1, (b, (v + 31) // 32), generator=g, dtype=torch.int64).to(torch.int32)
        yield (logits, mask.to(device)), {}


OPS = [OpSpec("structured.apply_bitmask", apply_token_bitmask, _gen)]
