"""Lossless verification of one request's drafts (ENGINE_FEATURES.md 1.4-1.5).

Rows: the target's processed logits for ``[anchor, d_1..d_L]`` (``Sampler.process``, so the
same min-tokens mask, penalties, temperature and top-k/top-p/min-p as plain sampling; row i's
history includes ``d_1..d_i``). Row i judges ``d_{i+1}``; the row after the last accepted draft
gives one more token (the correction, or the bonus when all L are accepted). So a request
emits between 1 and L+1 tokens.

- Greedy: accept ``d_{i+1}`` iff it is row i's argmax. Emitted tokens equal plain greedy
  decoding whenever the verify rows equal one-token decode rows (batch-invariant kernels).
- Sampling (Leviathan et al.): accept iff ``u < p(d)/q(d)`` with ``u`` keyed by (seed,
  sequence, position) under its own salt; on rejection draw from ``normalise(max(p - q, 0))``;
  the bonus is drawn from ``p`` exactly like plain sampling at that position. Each emitted
  token is then distributed as p for ANY draft distribution q, and cutting the draft list
  short (confidence scheduling) keeps that true.
"""
from __future__ import annotations

import hashlib
from typing import Callable

import torch

ACCEPT_SALT = "deepinfer.accept"


def accept_uniform(seed: int, seq_index: int, position: int) -> float:
    """The accept-test coin U(0, 1) for the token at ``position`` of sequence ``seq_index``:
    a pure function of its key, independent of the sampling noise and of the draft's."""
    digest = hashlib.blake2b(f"{ACCEPT_SALT}:{seed}:{seq_index}:{position}".encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "little") >> 11) * (1.0 / (1 << 53)) or 2.0 ** -53


def verify_greedy(target_tokens: list[int], drafts: list[int]) -> list[int]:
    """target_tokens: argmax of rows 0..L (len L+1); drafts d_1..d_L -> emitted tokens."""
    if len(target_tokens) != len(drafts) + 1:
        raise ValueError(f"{len(target_tokens)} target rows for {len(drafts)} drafts (need drafts + 1)")
    out: list[int] = []
    for t, d in zip(target_tokens, drafts):
        out.append(t)
        if t != d:
            return out
    out.append(target_tokens[-1])
    return out


def verify_sampled(x: torch.Tensor, drafts: list[int], draft_probs: torch.Tensor | None, coins: list[float],
                   draw: Callable[[torch.Tensor, int], int]) -> list[int]:
    """Standard speculative sampling for one request.

    x [L+1, V] processed logits (``-inf`` = excluded); drafts d_1..d_L; draft_probs [L, V] the
    distributions the drafts were drawn from (None: greedy drafts, q one-hot); coins[i] the
    coin of row i; ``draw(logits [V], row)`` samples a token from ``softmax(logits)`` with row
    ``row``'s own noise (the plain sampler's stream for that position). Returns emitted tokens.
    """
    n = len(drafts)
    if x.shape[0] != n + 1 or len(coins) < n:
        raise ValueError(f"{x.shape[0]} rows / {len(coins)} coins for {n} drafts")
    p = torch.softmax(x.double(), dim=-1)  # fp64: the ratio test on tiny probabilities
    out: list[int] = []
    for i, d in enumerate(drafts):
        pd = float(p[i, d])
        qd = 1.0 if draft_probs is None else float(draft_probs[i, d])
        if qd > 0 and coins[i] * qd < pd:
            out.append(d)
            continue
        if draft_probs is None:
            residual = p[i].clone()
            residual[d] = 0.0
        else:
            residual = (p[i] - draft_probs[i].double()).clamp_min(0.0)
        if not float(residual.sum()) > 0:  # p == q exactly: the test accepts a.s.; guard only
            residual = p[i]
        out.append(draw(torch.log(residual).float(), i))
        return out
    out.append(draw(x[n], n))
    return out
