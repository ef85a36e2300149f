"""SchedulerOutput: what one engine step runs (the Scheduler -> ModelRunner hop).

Every field is plain CPU Python (ints, lists of ints, strings); the runner turns
them into device tensors once per step. Lists are snapshots: the scheduler may
plan the next step (async scheduling) while the runner still reads this one.
Block tables are sent whole each step (simple, O(blocks) per request); sending
only the new entries is a possible later optimisation.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ScheduledRequest:
    """One request's share of a step: feed ``token_ids`` at positions ``[num_computed_tokens, +n)``.

    - ``token_ids``: ``num_scheduled_tokens`` ids. An id equal to
      ``request.PLACEHOLDER_TOKEN_ID`` (-1) can only be the last one and only in a
      single-token decode: it is the token this request's *previous* step samples,
      still on the device; the runner substitutes it from its sampled-token buffer.
    - ``block_tables``: paged group index -> block ids; entry ``i`` holds tokens
      ``[i*B_g, (i+1)*B_g)``; 0 is the null block (freed / never to be read).
    - ``state_slot``: index of the request's per-request state (compressor
      buffers...). ``num_computed_tokens == 0`` means the slot must be reset first.
    - ``is_prefill``: the chunk is not a single-token decode (more than one token,
      or still inside the prompt).
    - ``samples``: the chunk ends at the last known token, so the runner samples
      one token for this request (otherwise it is a middle prefill chunk).
    - ``epoch``: the request's preemption count when scheduled (stale-step check).
    - ``cached_until``: positions below it were served by a prefix-cache hit; the
      runner recomputes them only to rebuild per-request state and writes no KV for them.
    - ``num_draft_tokens``: speculative decoding: the last L ids of ``token_ids`` are drafts
      to verify (the id before them is the anchor, the last known token); the runner returns
      1..L+1 tokens for this request and the scheduler rolls back the rejected positions.
    - ``window_floor``: bounded prefix replay: the request has no sliding-window KV below this
      position (its hit's replay start); attention windows are floored there and the replayed
      tokens' sliding-window KV is written (rebuilt) even below ``cached_until``. 0 = none.
    """

    req_id: str
    num_scheduled_tokens: int
    num_computed_tokens: int
    token_ids: list[int]
    block_tables: dict[int, list[int]]
    state_slot: int
    is_prefill: bool
    samples: bool
    epoch: int = 0
    cached_until: int = 0
    num_draft_tokens: int = 0
    window_floor: int = 0


@dataclass(frozen=True)
class SchedulerOutput:
    """One step: running requests first (FCFS), then newly admitted ones.

    ``preempted_req_ids``: preempted while planning this step (their blocks and
    state slots are already reused here; drop any per-request caches).
    ``finished_req_ids``: requests that finished (any reason, aborts included)
    since the previous ``schedule()``; the runner frees its per-request data.
    """

    step_id: int
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted_req_ids: list[str] = field(default_factory=list)
    finished_req_ids: list[str] = field(default_factory=list)

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(s.num_scheduled_tokens for s in self.scheduled)

    @property
    def num_scheduled_tokens(self) -> dict[str, int]:
        return {s.req_id: s.num_scheduled_tokens for s in self.scheduled}

    @property
    def sampling_req_ids(self) -> list[str]:
        """Requests the runner must sample a token for, in batch order."""
        return [s.req_id for s in self.scheduled if s.samples]

    @property
    def is_empty(self) -> bool:
        return not self.scheduled
