"""A large FP8 GEMV inside a ``stream.side`` branch run as a background job (opt-in, not yet measured).

Why (docs/performance.md, thirty-sixth pass). V4.1's Engram lookups fork at the step's start and are joined one
or more layers later. Their ``wkv`` GEMV (157 MB at one row) launches ~800 programs, about 6 an SM, so the main
stream's next small kernels find the SMs full: in the H200's graphed profile the step's first two kernels ran 2-4x
slower beside it. With ``DEEPINFER_NV_BRANCH_GEMV_TILES=N`` a GEMV issued inside a branch whose weight has at least
``MIN_BYTES`` bytes runs as a chain of launches over N 64-row tiles each (one program an SM aimed for, ``programs=1``
of the wgmma GEMV's plan), so at any time it holds a few programs an SM and leaves the rest to the chain; the
outputs are concatenated. Each output element is the same GEMV's sum over the same K splits only where the
split is the same: the capped launches may split K differently, so outputs can differ in the last bits from the
uncapped launch (never across runs: the plan depends on the shapes only).

0 (default): off. The GEMVs a branch joined soon runs (the shared expert, the compressor) are under ``MIN_BYTES``.
"""
from __future__ import annotations

import math
import os
from typing import Callable

import torch

from deepinfer_nvidia.kernels.cuda_side_stream import lane

BRANCH_GEMV_TILES = int(os.environ.get("DEEPINFER_NV_BRANCH_GEMV_TILES", "0"))
MIN_BYTES = 64 << 20


def takes(q: torch.Tensor, tiles: int | None = None) -> bool:
    """Whether a GEMV over ``q`` [N, K] (e4m3) issued now runs capped: the knob on, inside a branch, a large weight."""
    tiles = BRANCH_GEMV_TILES if tiles is None else tiles
    return tiles > 0 and lane() > 0 and q.numel() * q.element_size() >= MIN_BYTES


def gemv_in_chunks(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, s_cols: int, bn_blk: int, bk_blk: int,
                   sms: int, gemv: Callable[..., torch.Tensor], tiles: int | None = None) -> torch.Tensor:
    """y [M, N] = x [M, K] @ dequant(q [N, K], s)^T as launches of ``gemv`` (``gluon_fp8_gemv.gemv_wgmma``'s
    signature) over row chunks of ``tiles`` 64-row tiles (rounded up to whole ``bn_blk`` scale blocks), each
    aiming at one program an SM; s: the UE8M0 bytes [ceil(N / bn_blk), s_cols]."""
    tiles = BRANCH_GEMV_TILES if tiles is None else tiles
    n = q.shape[0]
    unit = math.lcm(64, bn_blk)  # a chunk starts on a 64-row tile and a scale row
    rows = max(unit, (tiles * 64 + unit - 1) // unit * unit)
    parts = [gemv(x, q[r0:r0 + rows], s[r0 // bn_blk:(min(r0 + rows, n) + bn_blk - 1) // bn_blk], s_cols, bn_blk,
                  bk_blk, sms, programs=1) for r0 in range(0, n, rows)]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
