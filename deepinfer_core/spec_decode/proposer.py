"""The proposer contract between the runner (core) and a model's draft model.

A proposer is built by the model package (``model.load_proposer(...)``), so the core never
imports a model: it only calls these methods. Every tensor lives on the model's device.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from deepinfer_core.kv.spec import KVCacheSpec
from deepinfer_core.runner.context import StepContext


@dataclass
class DraftBatch:
    """One propose call for B requests.

    tokens int64 [B, N] (draft k proposes position ``P + k + 1``; P = the anchor's position);
    probs fp32 [B, N, V] or None: the distribution each draft was drawn from (None = greedy
    drafts, i.e. one-hot); confidence fp32 [B, N] or None: P(draft k accepted | drafts < k).
    """

    tokens: torch.Tensor
    probs: torch.Tensor | None
    confidence: torch.Tensor | None


class Proposer(Protocol):
    num_draft_tokens: int
    tap_layer_ids: tuple[int, ...]  # target layers whose features the proposer reads
    has_confidence: bool

    def kv_cache_specs(self) -> dict[str, KVCacheSpec]:
        """The proposer's own caches (allocated by the executor next to the target's)."""

    def observe(self, taps: dict[int, torch.Tensor], ctx: StepContext) -> None:
        """Record the target step's features (``taps[layer]`` [T, D]) for its rows (context KV)."""

    def propose(self, anchor_ids: torch.Tensor, ctx: StepContext, seeds: list[int | None],
                temperatures: list[float]) -> DraftBatch:
        """anchor_ids [B]; ``ctx`` covers N positions ``P..P+N-1`` per request. ``seeds[b]`` None =
        greedy draft; else drawn at ``temperatures[b]`` with noise keyed by (seed, position)."""
