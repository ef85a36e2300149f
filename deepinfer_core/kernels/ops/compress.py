"""KV compressor pooling (DeepSeek-V4 CSA/HCA, V4.1 ratio 2).

A window of ``S`` slots (tokens, or token halves for the overlapping CSA) is
pooled into one entry by a per-channel softmax over the slots of the gate
scores. Slots that do not exist carry score ``-inf`` (weight 0).
"""
from __future__ import annotations

import torch

from deepinfer_core.kernels.ops.linalg import down, up
from deepinfer_core.kernels.spec import OpSpec, acc


def softmax_pool(kv: torch.Tensor, score: torch.Tensor) -> torch.Tensor:
    """kv [N, S, d] float; score [N, S, d] fp32 (``-inf`` = absent slot). Returns [N, d] in kv.dtype.

    ``out[n, c] = sum_s softmax_s(score[n, :, c]) * kv[n, s, c]``; the softmax is fp32.
    Absent slots (score -inf) contribute exactly zero even if kv holds garbage there.
    """
    w = down(up(score).softmax(dim=1), acc(score))
    kvz = torch.where(torch.isneginf(score), torch.zeros_like(kv), kv)
    return (kvz * w.to(kv.dtype)).sum(dim=1)


def _gen_pool(dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    for n, s, d in [(1, 2, 8), (5, 8, 64), (3, 128, 512)]:
        kv = torch.randn(n, s, d, generator=g).to(dtype).to(device)
        sc = torch.randn(n, s, d, generator=g).float()
        sc[:, : s // 4] = float("-inf") if s >= 4 else sc[:, : s // 4]
        yield (kv, sc.to(device)), {}


OPS = [OpSpec("compress.softmax_pool", softmax_pool, _gen_pool)]
