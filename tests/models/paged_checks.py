"""Checks shared by the V4 and V4.1 model tests: random prompts, one-step teacher-forced logits through the paged
path, and the batched prefill-then-decode comparison against them."""
from __future__ import annotations

import torch

from deepinfer_core.runner.executor import PagedExecutor
from deepinfer_core.runner.simple_driver import run_requests


def prompt(n: int, seed: int = 0) -> list[int]:
    """``n`` token ids drawn from the real vocabulary's range (ids 3..128999), seeded."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 129000, (n,), generator=g).tolist()


def full_logits(model, ids: list[int]) -> torch.Tensor:
    """Teacher-forced logits [len(ids), V] of one sequence, prefilled in a single step through the paged path."""
    ex = PagedExecutor(model, num_blocks=256, max_num_seqs=2)
    return model.compute_logits(run_requests(ex, [ids], [[(0, len(ids))]])[0])


def batched_decode_matches_full(model, ids: list[int], ks: list[int], n_decode: int,
                                tol: float = 1e-4) -> dict[int, torch.Tensor]:
    """Requests ``ids[:k + n_decode]`` for every k in ``ks``: all prefill their k tokens in one step, then decode
    ``n_decode`` steps one token each, batched; every request's logits must be within ``tol`` of ``ids``' one-step
    logits. Returns the hidden states by request index (for further checks)."""
    full = full_logits(model, ids)
    requests = [ids[: k + n_decode] for k in ks]
    schedule = [[(i, k) for i, k in enumerate(ks)]] + [[(i, 1) for i in range(len(ks))] for _ in range(n_decode)]
    hidden = run_requests(PagedExecutor(model, num_blocks=512, max_num_seqs=len(ks)), requests, schedule)
    for i, k in enumerate(ks):
        diff = (model.compute_logits(hidden[i]) - full[: k + n_decode]).abs().max().item()
        assert diff < tol, f"k={k}: max |logit diff| {diff:.3g}"
    return hidden
