"""Sampling ops: penalties, top-k/top-p/min-p filtering and the exponential race.

These are the batched, device-side pieces of ``deepinfer_core.runner.sampler``.
Every op works row by row (one row = one sequence being sampled): nothing in a
row's result depends on the other rows, which is what batch-invariant sampling
needs. All three are pure functions: inputs are never modified.

Token-id padding convention (as in vLLM): ragged token-id lists are padded with
the value ``vocab_size``, an id no real token has; padded slots are ignored.
"""
from __future__ import annotations

import torch

from deepinfer_core.kernels.spec import OpSpec


def _work_dtype(x: torch.Tensor) -> torch.dtype:
    """fp64 stays fp64 (exact tests); everything else is computed in fp32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _check_rows(name: str, logits: torch.Tensor, **per_row: torch.Tensor) -> None:
    if logits.dim() != 2:
        raise ValueError(f"{name}: logits must be 2-D [B, V], got shape {tuple(logits.shape)}")
    if not logits.is_floating_point():
        raise TypeError(f"{name}: logits must be a float tensor, got {logits.dtype}")
    b = logits.shape[0]
    for arg, t in per_row.items():
        if t.dim() != 1 or t.shape[0] != b:
            raise ValueError(f"{name}: {arg} must have shape [{b}], got {tuple(t.shape)}")


def token_counts(token_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Occurrences of each token per row. token_ids [B, L] int64 padded with
    ``vocab_size``; returns int64 [B, V]."""
    if token_ids.dim() != 2:
        raise ValueError(f"token_ids must be 2-D [B, L], got shape {tuple(token_ids.shape)}")
    b = token_ids.shape[0]
    # One extra column swallows the padding value, then is dropped.
    counts = torch.zeros(b, vocab_size + 1, dtype=torch.int64, device=token_ids.device)
    counts.scatter_add_(1, token_ids.long(), torch.ones_like(token_ids, dtype=torch.int64))
    return counts[:, :vocab_size]


def apply_penalties(
    logits: torch.Tensor,
    prompt_token_ids: torch.Tensor,
    output_token_ids: torch.Tensor,
    repetition_penalties: torch.Tensor,
    frequency_penalties: torch.Tensor,
    presence_penalties: torch.Tensor,
) -> torch.Tensor:
    """Repetition, frequency and presence penalties (vLLM v1 semantics).

    logits [B, V] float; prompt_token_ids [B, Lp] and output_token_ids [B, Lo]
    int64 padded with V; the three penalties are float [B].

    - repetition (``r``), over tokens seen in the prompt OR the output: a
      positive logit is divided by ``r``, a non-positive one multiplied by ``r``;
    - frequency (``f``) and presence (``p``), over OUTPUT tokens only:
      ``logit -= f * count + p * (count > 0)``.

    A row with r=1, f=0, p=0 is returned unchanged. Returns a new tensor of
    ``logits.dtype`` (computed in fp32, or fp64 for fp64 input).
    """
    _check_rows("sample.apply_penalties", logits, repetition_penalties=repetition_penalties,
                frequency_penalties=frequency_penalties, presence_penalties=presence_penalties)
    b, v = logits.shape
    for arg, ids in (("prompt_token_ids", prompt_token_ids), ("output_token_ids", output_token_ids)):
        if ids.dim() != 2 or ids.shape[0] != b:
            raise ValueError(f"sample.apply_penalties: {arg} must have shape [{b}, L], got {tuple(ids.shape)}")
    wd = _work_dtype(logits)
    x = logits.to(wd)
    out_counts = token_counts(output_token_ids, v)
    seen = (token_counts(prompt_token_ids, v) > 0) | (out_counts > 0)

    rep = repetition_penalties.to(wd)[:, None]
    repeated = torch.where(x > 0, x / rep, x * rep)
    x = torch.where(seen, repeated, x)

    x = x - frequency_penalties.to(wd)[:, None] * out_counts.to(wd)
    x = x - presence_penalties.to(wd)[:, None] * (out_counts > 0).to(wd)
    return x.to(logits.dtype)


def topk_topp_minp(
    logits: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
) -> torch.Tensor:
    """Mask filtered-out tokens to -inf; logits are already temperature-scaled.

    logits [B, V] float; top_k [B] int (<= 0 or >= V: off); top_p [B] float
    (>= 1: off); min_p [B] float (0: off). Returns a new tensor, ``logits.dtype``.

    Order (vLLM v1): min-p, then top-k, then top-p.
    - min-p drops tokens whose probability is below ``min_p * max_prob``;
    - top-k keeps tokens whose logit is >= the k-th largest logit, so tokens
      tied with the k-th one are all kept;
    - top-p renormalises what is left and, walking tokens from most to least
      likely (ties: lower token id first), keeps a token while the probability
      mass strictly before it is < p: the first token that reaches or crosses
      p is included. At least one token always survives.
    """
    _check_rows("sample.topk_topp_minp", logits, top_k=top_k, top_p=top_p, min_p=min_p)
    b, v = logits.shape
    wd = _work_dtype(logits)
    x = logits.to(wd)
    # a device fill, not torch.tensor(...): no host-to-device copy, so the op can be captured in a CUDA graph
    neg_inf = x.new_full((), float("-inf"))

    # min-p; the most likely token always passes (its prob >= min_p * itself).
    probs = torch.softmax(x, dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True) * min_p.to(wd)[:, None]
    x = torch.where(probs < threshold, neg_inf, x)

    # Stable descending sort: equal logits keep ascending token-id order.
    sorted_x, order = torch.sort(x, dim=-1, descending=True, stable=True)

    # top-k: threshold at the k-th largest value (ties with it survive).
    k = top_k.to(device=x.device, dtype=torch.int64)
    k = torch.where((k <= 0) | (k >= v), torch.full_like(k, v), k)
    kth = sorted_x.gather(1, (k - 1)[:, None])
    sorted_x = torch.where(sorted_x < kth, neg_inf, sorted_x)

    # top-p on the renormalised survivors. Masked entries only ever sit at the
    # tail of the sorted row, so the sort order is still valid.
    sorted_probs = torch.softmax(sorted_x, dim=-1)
    running = torch.cumsum(sorted_probs, dim=-1)
    # Mass strictly before each token: the running sum shifted right by one.
    mass_before = torch.cat([torch.zeros_like(running[:, :1]), running[:, :-1]], dim=-1)
    p = top_p.to(wd)[:, None]
    # p >= 1 is "off" explicitly: rounding can push the running sum to 1 early.
    keep_sorted = (mass_before < p) | (p >= 1)
    keep_sorted[:, 0] = True
    remove_sorted = ~keep_sorted | torch.isneginf(sorted_x)
    remove = torch.empty_like(remove_sorted).scatter_(1, order, remove_sorted)
    return torch.where(remove, neg_inf, x).to(logits.dtype)


def exponential_race(logits: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Sample one token per row: ``argmax(softmax(logits) / q)``.

    logits [B, V] float (filtered, -inf = excluded); q [B, V] float, i.i.d.
    Exp(1) noise drawn by the caller. Returns int64 [B].

    If q ~ Exp(1) then ``q_i / p_i`` ~ Exp(p_i) and the smallest of independent
    exponentials is index i with probability p_i, so the argmax of ``p / q`` is
    an exact draw from p (equivalently Gumbel-max, since ``-log q`` is Gumbel).
    The caller owns the randomness, so the result is a pure function of
    (logits, q): a per-request generator makes a row reproducible.
    q is clamped away from 0 so an excluded token (p = 0) can never win via 0/0.
    """
    _check_rows("sample.exponential_race", logits)
    if q.shape != logits.shape:
        raise ValueError(f"sample.exponential_race: q must have the logits' shape {tuple(logits.shape)}, "
                         f"got {tuple(q.shape)}")
    wd = _work_dtype(logits)
    probs = torch.softmax(logits.to(wd), dim=-1)
    noise = q.to(wd).clamp_min(torch.finfo(torch.float32).tiny)
    return (probs / noise).argmax(dim=-1)


# -- conformance input generators ------------------------------------------------

_SHAPES = [(1, 8), (4, 50), (9, 257), (3, 4099)]


def rounding_boundary_tokens(x: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor,
                             tol: float = 1e-5) -> torch.Tensor:
    """``[B, V]`` bool: tokens whose keep / drop decision in ``topk_topp_minp`` lies within fp32 rounding, found by
    a float64 walk in the reference's order (top-p mass before the token within ``tol`` of p; a probability
    within ``tol`` (relative) of min-p's threshold flags its whole row, since it changes the top-p
    renormalisation). For checking kernels whose masks may differ from the reference only there."""
    neg = float("-inf")
    x = x.double()
    v = x.shape[1]
    e = torch.exp(x - x.amax(-1, keepdim=True))
    mp = min_p.double()[:, None]
    minp_row = (((e - mp).abs() <= tol * mp) & (mp > 0)).any(-1, keepdim=True)
    x = torch.where(e < mp, neg, x)
    sx, order = torch.sort(x, dim=-1, descending=True, stable=True)
    k = top_k.long()
    k = torch.where((k <= 0) | (k >= v), v, k)
    sx = torch.where(sx < sx.gather(1, (k - 1)[:, None]), neg, sx)
    probs = torch.softmax(sx, dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs
    p = top_p.float().double()[:, None]
    near = ((before - p).abs() <= tol) & (p < 1)
    return torch.empty_like(near).scatter_(1, order, near) | minp_row


def _gen_penalties(dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    for b, v in _SHAPES:
        logits = (3 * torch.randn(b, v, generator=g)).to(dtype)
        lp, lo = 5, 7

        def ids(length: int) -> torch.Tensor:
            t = torch.randint(0, v, (b, length), generator=g)
            pad = torch.rand(b, length, generator=g) < 0.3
            return torch.where(pad, torch.full_like(t, v), t)

        rep = 0.5 + 1.5 * torch.rand(b, generator=g)
        freq = 4 * torch.rand(b, generator=g) - 2
        pres = 4 * torch.rand(b, generator=g) - 2
        rep[0], freq[0], pres[0] = 1.0, 0.0, 0.0  # an untouched row
        yield (logits.to(device), ids(lp).to(device), ids(lo).to(device),
               rep.to(device), freq.to(device), pres.to(device)), {}


def _gen_filters(dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    for b, v in _SHAPES:
        logits = (2 * torch.randn(b, v, generator=g)).to(dtype)
        top_k = torch.randint(0, min(v, 40) + 1, (b,), generator=g)
        top_p = torch.where(torch.rand(b, generator=g) < 0.3, torch.ones(b), 0.05 + 0.9 * torch.rand(b, generator=g))
        min_p = torch.where(torch.rand(b, generator=g) < 0.5, torch.zeros(b), 0.2 * torch.rand(b, generator=g))
        yield (logits.to(device), top_k.to(device), top_p.to(device), min_p.to(device)), {}


def _gen_race(dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    for b, v in _SHAPES:
        logits = (2 * torch.randn(b, v, generator=g))
        logits[torch.rand(b, v, generator=g) < 0.5] = float("-inf")
        logits[:, 0] = 0.0  # at least one finite token per row
        q = torch.empty(b, v).exponential_(generator=g)
        yield (logits.to(dtype).to(device), q.to(device)), {}


def _compare_masked(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    """Same -inf pattern exactly; finite values within the dtype's tolerance."""
    out_mask, ref_mask = torch.isneginf(out), torch.isneginf(ref)
    if not torch.equal(out_mask.cpu(), ref_mask.cpu()):
        n = int((out_mask != ref_mask).sum())
        raise AssertionError(f"filter masks differ in {n} positions")
    atol, rtol = OPS_BY_NAME["sample.topk_topp_minp"].tolerance(dtype)
    torch.testing.assert_close(out[~out_mask].double().cpu(), ref[~ref_mask].double().cpu(), atol=atol, rtol=rtol)


def _compare_ids(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    if out.dtype != torch.int64 or not torch.equal(out.cpu(), ref.cpu()):
        raise AssertionError(f"sampled ids differ: got {out.tolist()} ({out.dtype}), expected {ref.tolist()}")


OPS = [
    OpSpec("sample.apply_penalties", apply_penalties, _gen_penalties,
           doc="repetition (prompt+output), frequency and presence (output) penalties"),
    OpSpec("sample.topk_topp_minp", topk_topp_minp, _gen_filters, compare=_compare_masked,
           doc="min-p, top-k, top-p filtering of temperature-scaled logits to -inf"),
    OpSpec("sample.exponential_race", exponential_race, _gen_race, compare=_compare_ids,
           doc="argmax(softmax(logits) / q) with caller-drawn Exp(1) noise q"),
]
OPS_BY_NAME = {spec.name: spec for spec in OPS}
