"""Two-level candidate-block filter of the DeepSeek-V4.1 indexer (MODEL_SPEC.md 3.6).

The candidate *source* indexer groups compressed positions into blocks of ``block_size``
consecutive entries, scores each block by its best logit, always keeps the block holding
the newest visible entry, and publishes the ids of the ``topk_blocks`` best blocks per
query token. Later index sources (the *consumers*) score only entries inside the
published blocks before their own top-k.

Scores are ``[T, N]`` in entry order (column j = compressed position j), ``-inf`` where an
entry is not visible; the width N may include batch padding, which only ever adds
``-inf`` columns, and ties are broken toward the lower block id by a stable sort, so a
token's blocks do not depend on the batch.
"""
from __future__ import annotations

import torch

from deepinfer_core.kernels.spec import OpSpec


def candidate_blocks(scores: torch.Tensor, num_visible: torch.Tensor, block_size: int,
                     topk_blocks: int) -> torch.Tensor:
    """Block ids to keep per query. scores [T, N] fp32; num_visible [T] int64 (visible entries
    are ``0 .. num_visible-1``). Returns int64 [T, topk_blocks], best first, -1 padded.

    Block b's score is ``max(scores[t, b*bs:(b+1)*bs])``; block ``(num_visible-1)//bs`` is forced
    to +inf when ``num_visible > 0``; blocks whose score is -inf are never returned.
    """
    t, n = scores.shape
    nb = -(-n // block_size)
    padded = torch.full((t, nb * block_size), float("-inf"), dtype=scores.dtype, device=scores.device)
    padded[:, :n] = scores
    bmax = padded.view(t, nb, block_size).amax(dim=-1) if nb else padded.new_zeros(t, 0)
    newest = (num_visible - 1).div(block_size, rounding_mode="floor")
    force = (num_visible > 0) & (newest < nb)
    if nb:
        # a masked fill over all blocks, not bmax[rows[force], ...]: boolean indexing would make the
        # host wait for the device (no graph capture)
        hit = force[:, None] & (torch.arange(nb, device=scores.device)[None, :] == newest[:, None])
        bmax = bmax.masked_fill(hit, float("inf"))
    vals, ids = torch.sort(bmax, dim=-1, descending=True, stable=True)
    k = min(topk_blocks, nb)
    ids = torch.where(torch.isneginf(vals[:, :k]), torch.full_like(ids[:, :k], -1), ids[:, :k])
    if k < topk_blocks:
        ids = torch.cat([ids, ids.new_full((t, topk_blocks - k), -1)], dim=1)
    return ids


def candidate_mask(scores: torch.Tensor, blocks: torch.Tensor, block_size: int) -> torch.Tensor:
    """``scores`` [T, N] with every entry outside the listed blocks set to -inf.
    blocks [T, K] int64 block ids (-1 = none)."""
    t, n = scores.shape
    nb = -(-n // block_size)
    allowed = torch.zeros(t, nb + 1, dtype=torch.bool, device=scores.device)
    col = torch.where((blocks >= 0) & (blocks < nb), blocks, torch.full_like(blocks, nb))
    allowed.scatter_(1, col, True)
    keep = allowed[:, torch.arange(n, device=scores.device) // block_size]
    return scores.masked_fill(~keep, float("-inf"))


def _gen_blocks(dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    for t, n, bs, kb in [(4, 10, 4, 2), (9, 70, 8, 3), (3, 20, 4, 16)]:
        s = torch.randn(t, n, generator=g)
        vis = torch.randint(0, n + 1, (t,), generator=g)
        s[torch.arange(n)[None, :] >= vis[:, None]] = float("-inf")
        yield (s.to(device), vis.to(device), bs, kb), {}


def _gen_mask(dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    for t, n, bs, kb in [(4, 10, 4, 2), (9, 70, 8, 3)]:
        s = torch.randn(t, n, generator=g)
        blocks = torch.randint(-1, -(-n // bs), (t, kb), generator=g)
        yield (s.to(device), blocks.to(device), bs), {}


def _compare_sets(out, ref, dtype):
    assert torch.equal(out.sort(dim=-1).values.cpu(), ref.sort(dim=-1).values.cpu()), "candidate block sets differ"


OPS = [
    OpSpec("index.candidate_blocks", candidate_blocks, _gen_blocks, compare=_compare_sets,
           doc="top blocks of the candidate-source indexer, newest block forced"),
    OpSpec("index.candidate_mask", candidate_mask, _gen_mask, doc="mask consumer scores to the candidate blocks"),
]
