"""Lightning indexer: score compressed entries and pick the top-k per query."""
from __future__ import annotations

import torch

from deepinfer_core.kernels.ops.linalg import down
from deepinfer_core.kernels.spec import OpSpec, acc


def indexer_scores(q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor, cand: torch.Tensor,
                   score_scale: float) -> torch.Tensor:
    """Index scores of candidate entries.

    q [T, Hi, Di]; weights [T, Hi] any float dtype (per-head weights; a constant scale of theirs may ride in
    ``score_scale``, as the models pass it); keys [S, Di] flat
    index-key cache; cand [T, N] int64 slots (-1 = not visible). Returns fp32 [T, N]:
    ``sum_h weights[t,h] * relu(q[t,h] . keys[cand[t,n]]) * score_scale``, ``-inf`` where cand < 0.
    """
    # fp64 whatever the input dtype (see attention.py): N depends on the batch, the bits must not.
    k = keys[cand.clamp(min=0)].double()  # [T, N, Di]
    s = torch.einsum("thd,tnd->thn", q.double(), k).relu() * score_scale
    out = down((s * weights.to(s.dtype)[:, :, None]).sum(dim=1), acc(q))
    return out.masked_fill(cand < 0, float("-inf"))


def topk_positions(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Top-k positions of each row of fp32 scores [T, N] (-inf = invalid). Returns int64 [T, min(k, N)], -1 padded.

    Rows are ordered by score, ties by lower position; callers may treat them as sets.
    """
    kk = min(k, scores.shape[1])
    if kk == 0:
        return torch.empty(scores.shape[0], 0, dtype=torch.long, device=scores.device)
    # A stable descending sort breaks ties toward the lower position, so the selection
    # never depends on how much -inf padding the batch added after a row's candidates.
    vals, pos = torch.sort(scores, dim=-1, descending=True, stable=True)
    vals, pos = vals[:, :kk], pos[:, :kk]
    return torch.where(torch.isneginf(vals), torch.full_like(pos, -1), pos)


def _gen_scores(dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    for t, h, d, s, n in [(2, 2, 8, 5, 5), (9, 8, 32, 40, 17), (4, 64, 128, 300, 260)]:
        q = torch.randn(t, h, d, generator=g).to(dtype).to(device)
        w = torch.randn(t, h, generator=g).float().to(device)
        keys = torch.randn(s, d, generator=g).to(dtype).to(device)
        cand = torch.randint(-1, s, (t, n), generator=g).to(device)
        yield (q, w, keys, cand, d ** -0.5), {}
        # weights in q's dtype with their scale in score_scale, as the models pass weights_proj's output
        yield (q, w.to(dtype), keys, cand, d ** -0.5 * h ** -0.5), {}


def _compare_topk(out, ref, dtype):
    # top-k is a set: compare sorted rows.
    assert torch.equal(out.sort(dim=-1).values, ref.sort(dim=-1).values), "top-k sets differ"


def _gen_topk(dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    for t, n, k in [(3, 5, 8), (6, 100, 16), (2, 1000, 512)]:
        s = torch.randn(t, n, generator=g)
        s[:, n // 2:] = float("-inf")
        yield (s.float().to(device), k), {}


def entry_slots(visible: torch.Tensor, sel: torch.Tensor) -> torch.Tensor:
    """The cache slots of selected compressed entries: visible [T, N] int64 (a group's ``read_idx``: slot of each
    entry in position order, -1 = not visible), sel [T, k] int64 (top-k positions into those N, -1 padded) ->
    [T, k] int64 ``visible[t, sel[t, j]]``, -1 where ``sel < 0``. Positions must be below N."""
    return torch.where(sel >= 0, visible.gather(1, sel.clamp(min=0)), torch.full_like(sel, -1))


def _gen_entry_slots(dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    for t, n, k in [(1, 1, 1), (1, 64, 16), (5, 700, 512), (33, 2048, 512), (3, 40, 64)]:
        visible = torch.randint(0, 1 << 40, (t, n), generator=g)
        visible[torch.rand(t, n, generator=g) < 0.2] = -1
        sel = torch.randint(0, n, (t, k), generator=g)
        sel[torch.rand(t, k, generator=g) < 0.3] = -1
        yield (visible.to(device), sel.to(device)), {}
    # a selection that is a column slice of a wider tensor (its rows strided)
    wide = torch.randint(0, 64, (4, 48), generator=g)
    yield (torch.arange(4 * 64).view(4, 64).to(device), wide[:, 8:40].to(device)), {}


def _compare_exact(out, ref, dtype):
    assert out.dtype == ref.dtype and torch.equal(out.cpu(), ref.cpu()), "entry slots differ"


OPS = [
    OpSpec("index.entry_slots", entry_slots, _gen_entry_slots, compare=_compare_exact,
           doc="the cache slots of top-k selected compressed entries"),
    OpSpec("index.scores", indexer_scores, _gen_scores, tolerances={torch.bfloat16: (5e-2, 5e-2)}),
    OpSpec("index.topk", topk_positions, _gen_topk, compare=_compare_topk),
]
