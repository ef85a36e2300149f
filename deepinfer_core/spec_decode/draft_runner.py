"""The runner side of a proposer: feed it every target step's features, ask it for drafts.

Per step (after the target forward and verification):

1. ``observe``: the proposer reads the tapped target features of every row of the step
   (prefill chunks included, so its context covers every prompt position). Rows of rejected
   drafts are written too: they lie at positions the next draft block overwrites before it
   reads them (block positions ``P'..P'+N-1`` cover every rejected position).
2. ``propose``: for each request that sampled, one draft block of N positions starting at
   its new anchor (the last emitted token). The scheduler allocated blocks for them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from deepinfer_core.runner.context import SeqSlice, StepContext
from deepinfer_core.runner.sampler import derive_seed
from deepinfer_core.spec_decode.proposer import Proposer


@dataclass
class DraftRequest:
    """One request to draft for: the anchor token id and its position, its block tables and state slot."""

    req_id: str
    anchor: int
    position: int
    block_tables: dict[int, list[int]]
    state_slot: int
    seed: int | None  # None: greedy draft
    temperature: float


class DraftRunner:
    def __init__(self, proposer: Proposer, executor, draft_sample_method: str = "greedy"):
        self.proposer = proposer
        self.executor = executor
        graphs = getattr(executor, "graphs", None)
        if graphs is not None:  # greedy draft blocks replay captured graphs (decode_graphs.py)
            graphs.proposer = proposer
        self.n = proposer.num_draft_tokens
        self.probabilistic = draft_sample_method == "probabilistic"

    def draft_seed(self, params, seed: int, seq_index: int) -> int | None:
        """Greedy requests (and greedy drafting) draft by argmax; others from a per-sequence stream."""
        if params.greedy or not self.probabilistic:
            return None
        return derive_seed(seed, seq_index)

    @torch.inference_mode()
    def observe(self, taps: dict[int, torch.Tensor], ctx: StepContext) -> None:
        self.proposer.observe(taps, ctx)

    @torch.inference_mode()
    def propose(self, reqs: list[DraftRequest]) -> dict[str, tuple[list[int], list[float] | None, torch.Tensor | None]]:
        """-> {req_id: (draft tokens [N], confidences [N] or None, draft probs [N, V] or None)}."""
        if not reqs:
            return {}
        slices = [SeqSlice(r.position, self.n, r.block_tables, r.state_slot) for r in reqs]
        graphs = getattr(self.executor, "graphs", None)
        out = None
        if graphs is not None and all(r.seed is None for r in reqs) and graphs.supports_draft(slices):
            out = graphs.run_draft([r.anchor for r in reqs], slices)  # greedy blocks from a captured graph
        if out is None:
            ctx = self.executor.context(slices)
            anchors = torch.tensor([r.anchor for r in reqs], dtype=torch.long)
            out = self.proposer.propose(anchors, ctx, [r.seed for r in reqs], [r.temperature for r in reqs])
        tokens = out.tokens.tolist()
        conf = out.confidence.tolist() if out.confidence is not None else None
        result = {}
        for b, r in enumerate(reqs):
            probs = out.probs[b] if out.probs is not None and r.seed is not None else None
            result[r.req_id] = (tokens[b], None if conf is None else conf[b], probs)
        return result
