"""Per-forward scratch of the V4.1 model, built once per step from the ``StepContext``.

- ``StepRows``: per-token views of the request slices (first position of the token's
  slice in this step, its state slot, the last row of each slice), so per-request state
  (the ratio-2 compressor ring, the Engram history) is read and written with index math
  instead of Python loops over requests.
- ``IndexShare``: what index sources publish for later layers within one forward: the top-k
  compressed positions of each index source (read by the compressed layers up to the next
  index source) and the candidate blocks of the candidate source (read by later index
  sources). Nothing here outlives the step (MODEL_SPEC.md 3.13).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from deepinfer_core.runner.context import StepContext
from deepinfer_models.layers.decode_shortcuts import decode_shortcuts
from deepinfer_models.layers.static_index import compact, take_rows


@dataclass(frozen=True)
class StepRows:
    """Per-token slice facts, all int64 tensors on the step's device.

    ``start [T]``: position of the first token of the token's slice in this step;
    ``slot [T]``: the slice's state slot; ``last [B]``: row of each slice's last token.
    """

    start: torch.Tensor
    slot: torch.Tensor
    last: torch.Tensor
    decode: bool = False  # one token a slice (a decode step's layout): every token starts its slice

    @classmethod
    def from_context(cls, ctx: StepContext) -> "StepRows":
        """From the per-token / per-slice tensors ``build_step_context`` leaves in ``ctx.extras``. A decode step's
        context (one token a slice) carries the token's slot and the slices' last rows as they are, so no launch
        here: five fewer small kernels on a graphed decode step's chain (forty-second pass)."""
        if decode_shortcuts(ctx):  # DEEPINFER_DECODE_SHORTCUTS (layers/decode_shortcuts.py)
            return cls(start=ctx.extras["token_start"], slot=ctx.extras["token_slot"], last=ctx.extras["seq_last_row"],
                       decode=True)
        start = ctx.extras["token_start"]  # [T]
        first = ctx.extras["seq_first_row"]  # [B]
        n = ctx.extras["seq_end"] - start[first]  # tokens of each slice
        return cls(start=start, slot=ctx.state_slots[ctx.token_seq], last=first + n - 1)

    def ring_tail(self, ctx: StepContext, cap: int) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
        """Where a per-request ring of ``cap`` positions (the compressor ring, the Engram history) keeps this step:
        the rows of the last min(cap, n) tokens of each slice (distinct (slot, p % cap) pairs) as (rows [K] or None
        for every row, their ring rows ``slot * cap + p % cap`` [K], valid [K] or None for all), with the static
        bound K = min(T, B * cap) (no host sync). Every row at decode, so no index launches there; with one token
        a slice every token is its slice's last, so no mask either."""
        pos = ctx.positions
        t, k = pos.shape[0], min(pos.shape[0], self.last.shape[0] * cap)
        if self.last.shape[0] == t:
            keep, valid = None, None
        else:
            mask = pos > pos[self.last][ctx.token_seq] - cap
            keep, valid = (None, mask) if k == t else compact(mask, k)
        # slot * cap + p % cap as one add with alpha: two launches, not three (exact in int64)
        return keep, torch.add(take_rows(pos, keep) % cap, take_rows(self.slot, keep), alpha=cap), valid


@dataclass
class IndexShare:
    """Top-k positions by index-source layer id ([T, k] int64, -1 padded) and the candidate blocks, plus the cache
    slots already looked up for them this step (``entry_slots``)."""

    topk: dict[int, torch.Tensor] = field(default_factory=dict)
    candidates: torch.Tensor | None = None
    _slots: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=list)

    def entry_slots(self, visible: torch.Tensor, sel: torch.Tensor, lookup) -> torch.Tensor:
        """``lookup(visible, sel)`` (``index.entry_slots``: [T, k] int64 slots), once per step for each pair of these
        very tensors. Every compressed layer with the same kv source and index source reads the same entries: on the
        40-layer Flash topology 38 compressed layers share 8 (kv source, index source) pairs, so 30 of the 38
        lookups a step are repeats. Matched by identity, not value: a new ``read_idx`` or top-k (the decoder-side
        replay's cut, a new step) is a new lookup."""
        for v, s, slots in self._slots:
            if v is visible and s is sel:
                return slots
        slots = lookup(visible, sel)
        self._slots.append((visible, sel, slots))
        return slots
