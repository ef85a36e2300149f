"""Scheduler: continuous batching with chunked prefill, recompute preemption and async steps.

Unified, vLLM-v1 style (ENGINE_FEATURES.md section 4): there are no prefill or
decode phases. Each request has ``num_computed_tokens`` and a known length
(``num_tokens`` + sampled tokens in flight); a step gives it tokens to close the gap.

One ``schedule()``:

1. RUNNING requests in priority order (arrival, then add order) each get
   ``min(remaining, budget[, long_prefill_token_threshold])`` tokens (a decode
   gets 1). If the KV blocks are not there, the lowest-priority running request
   is preempted (blocks and state slot freed, ``num_computed_tokens`` reset to 0,
   outputs kept; WAITING is kept in priority order, so it goes back ahead of
   every request that arrived after it, i.e. to the front) until the allocation
   fits or the request itself is the lowest and yields. On resume it re-prefills
   prompt + outputs.
2. If nothing was preempted, WAITING requests are admitted in order while token
   budget, ``max_num_seqs`` and blocks allow. Admission is strict FCFS: the first
   request that does not fit stops admission.

Chunked prefill (default on) lets a prompt span steps. With it off a new prompt
is never split (it waits until the whole prompt fits the step's budget); only a
resumed request whose known tokens exceed the whole per-step budget is split.

Progress guarantee: ``add_request`` rejects a request that could not finish even
alone in the pool; a request that is alone and cannot get blocks for its whole
chunk gets the largest chunk that fits (even with chunked prefill off).

Async scheduling: ``schedule()`` for step N+1 may run before
``update_from_output`` for step N. A step that ends at a request's last known
token leaves a *placeholder* (``num_output_placeholders``): the next step feeds
``PLACEHOLDER_TOKEN_ID`` at that position and the runner substitutes the id the
previous step sampled on the device. Invariant: every request feeds the same
token ids at the same positions with the same KV as in sync mode, so outputs are
identical:

- a placeholder is only fed by a RUNNING request whose own previous step made it;
  a preempted request is not re-admitted until its in-flight sampled token arrived;
- no step is scheduled that could only produce tokens past ``max_tokens`` or
  ``max_model_len``; a step scheduled past an EOS/stop token (not yet known at
  schedule time) is discarded: a finished request's later outputs are ignored;
- a step scheduled before a preemption (stale epoch) still delivers its sampled
  token (the device ran it before the blocks were reused) but touches no counter;
- sliding-window blocks are freed only behind *processed* tokens (not in flight).
  Blocks freed at finish/preemption can be reused by the next step while an
  older step still runs: steps execute in order on the device, and a new owner
  only reads what it wrote itself, so this is safe.

Speculative decoding (``num_speculative_tokens`` N > 0): a decoding request is scheduled as
``[anchor, d_1..d_L]``, L = every draft it may use (capped so no step can emit past
``max_tokens``/``max_model_len``); confidence-scheduled verification trims L in the runner.
The drafts live in the runner (its proposer made them); ``Request.spec_token_ids`` is the
engine's copy of the last completed step's, used for the count. Accounting is optimistic: a
verify step advances ``num_computed_tokens`` by all ``1 + L`` fed tokens and counts ``1 + L``
output placeholders; when it returns ``e = 1 + accepted`` tokens both roll back by the rest. So under
async scheduling the next step is planned as if every draft were accepted (its ids are
placeholders), and the runner, which knows the truth when it runs it, feeds the real anchor
position and drafts. Blocks cover the optimistic range plus N positions for the proposer's next
draft block, which bounds every position the runner can write. Rejected rows lie at positions
the next step writes again before any query reads them.
"""
from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from deepinfer_core.kv.manager import KVCacheManager
from deepinfer_core.request import PLACEHOLDER_TOKEN_ID, Request, RequestStatus
from deepinfer_core.sched_output import ScheduledRequest, SchedulerOutput


@dataclass(frozen=True)
class SchedulerConfig:
    """Batching limits. ``long_prefill_token_threshold`` 0 = off; ``max_model_len`` None = unbounded."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    max_model_len: int | None = None
    num_speculative_tokens: int = 0

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        t = self.long_prefill_token_threshold
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise ValueError(f"long_prefill_token_threshold must be an int >= 0 (0 = off), got {t!r}")
        m = self.max_model_len
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 2):
            raise ValueError(f"max_model_len must be None or an int >= 2, got {m!r}")


def _priority(req: Request) -> tuple[float, int]:
    return (req.arrival, req.seq)


class Scheduler:
    """Owns WAITING/RUNNING queues and the KV manager; see the module docstring for the rules."""

    def __init__(self, config: SchedulerConfig, kv: KVCacheManager) -> None:
        if config.max_num_seqs > kv.max_num_seqs:
            raise ValueError(
                f"scheduler max_num_seqs {config.max_num_seqs} exceeds the KV manager's {kv.max_num_seqs} state slots"
            )
        self.config = config
        self.kv = kv
        self.waiting: list[Request] = []  # sorted by priority; preempted requests sort to the front
        self.running: list[Request] = []  # sorted by priority
        self.requests: dict[str, Request] = {}  # unfinished requests
        self._next_seq = 0
        self._next_step = 0
        # Scheduled, non-empty steps awaiting update_from_output, oldest first.
        self._pending: deque[tuple[int, list[tuple[Request, ScheduledRequest]]]] = deque()
        self._finished_ids: list[str] = []  # for the next SchedulerOutput
        self._failed: list[Request] = []  # errored in schedule(); returned by the next update
        self.spec_n = config.num_speculative_tokens
        self._drafts_planned: dict[str, int] = {}  # this schedule(): drafts to verify per request
        # bounded prefix replay: position below which a request has no sliding-window KV (its hit's
        # replay start); kept until the request is preempted or finishes, sent with every step
        self._window_floor: dict[str, int] = {}

    # -- queries ---------------------------------------------------------------
    def has_unfinished(self) -> bool:
        return bool(self.requests)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_steps_in_flight(self) -> int:
        return len(self._pending)

    def get_request(self, request_id: str) -> Request | None:
        return self.requests.get(request_id)

    # -- request lifecycle -------------------------------------------------------
    def add_request(self, req: Request) -> None:
        """Queue a fresh request; ValueError if it is a duplicate or could never run."""
        if not isinstance(req, Request):
            raise TypeError(f"add_request takes a Request, got {type(req).__name__}")
        rid = req.request_id
        if rid in self.requests:
            raise ValueError(f"request id {rid!r} is already queued or running")
        if req.status is not RequestStatus.WAITING or req.num_computed_tokens or req.output_token_ids:
            raise ValueError(f"request {rid!r} is not fresh (status {req.status.name}); add each Request once")
        cfg, p = self.config, req.num_prompt_tokens
        if cfg.max_model_len is not None and p >= cfg.max_model_len:
            raise ValueError(
                f"request {rid!r}: prompt has {p} tokens but max_model_len is {cfg.max_model_len} "
                "(at least one position must remain for output)"
            )
        if not cfg.enable_chunked_prefill and p > cfg.max_num_batched_tokens:
            raise ValueError(
                f"request {rid!r}: prompt has {p} tokens, more than max_num_batched_tokens="
                f"{cfg.max_num_batched_tokens}, and chunked prefill is off"
            )
        final_len = self._max_final_len(req)
        first_chunk = 1 if cfg.enable_chunked_prefill else p
        peak = self.kv.peak_blocks_alone(final_len - 1 + self.spec_n, first_chunk)
        if peak > self.kv.num_usable_blocks:
            raise ValueError(
                f"request {rid!r}: reaching {final_len} tokens needs {peak} KV blocks at once even alone, "
                f"but the pool has {self.kv.num_usable_blocks} usable blocks"
            )
        req.seq = self._next_seq
        self._next_seq += 1
        self.requests[rid] = req
        bisect.insort(self.waiting, req, key=_priority)

    def finish_request(self, request_id: str, status: RequestStatus) -> bool:
        """End a request (any state) with a finished ``status``; frees all its blocks.

        For the caller's stop conditions (stop strings) and aborts. Returns False
        if the id is unknown or already finished. Outputs of its in-flight steps
        are ignored when they arrive.
        """
        if not isinstance(status, RequestStatus) or not status.is_finished:
            raise ValueError(f"finish_request needs a FINISHED_* status, got {status!r}")
        req = self.requests.get(request_id)
        if req is None:
            return False
        self._finish(req, status)
        return True

    def abort_request(self, request_id: str) -> bool:
        return self.finish_request(request_id, RequestStatus.FINISHED_ABORTED)

    # -- one step ----------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """Plan the next step; counters advance now (optimistically), see the module docstring."""
        budget = self.config.max_num_batched_tokens
        planned: list[tuple[Request, int]] = []
        preempted: list[str] = []
        self._drafts_planned = self._plan_drafts(budget) if self.spec_n else {}

        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = self._num_new_tokens(req, budget)
            if n == 0:
                i += 1
                continue
            while not self._alloc(req, n):
                if self.running[-1] is not req:
                    self._preempt(self.running.pop(), preempted)
                    continue
                if i > 0:  # req is now the lowest priority: it yields its blocks
                    self._preempt(self.running.pop(), preempted)
                    n = 0
                    break
                n = self._fit_alone(req, n)  # alone in the pool
                break
            if req.is_finished or req.status is RequestStatus.PREEMPTED:
                continue  # removed from running; index i now points past the end or at the next one
            if n:
                planned.append((req, n))
                budget -= n
            i += 1

        while not preempted and self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.waiting[0]
            if req.num_output_placeholders:
                break  # a stale step's sampled token is still in flight; resume once it arrived
            hit = self._try_prefix_hit(req)
            n = self._num_new_tokens(req, budget)
            if hit and (n == 0 or not self._alloc(req, n)):
                self._undo_prefix_hit(req)  # admit it the ordinary way (or not at all) below
                hit, n = 0, self._num_new_tokens(req, budget)
            if not hit:
                if n == 0:
                    break
                if not self._alloc(req, n):
                    if self.running:
                        break  # running requests will free blocks
                    n = self._fit_alone(req, n)
                    if n == 0:
                        if req.is_finished:
                            continue  # _fit_alone failed it for good
                        break
            if req.num_computed_tokens == 0 or hit:
                self.kv.num_query_tokens += req.num_tokens
                self.kv.num_hit_tokens += hit
            self.waiting.pop(0)
            req.status = RequestStatus.RUNNING
            bisect.insort(self.running, req, key=_priority)
            planned.append((req, n))
            budget -= n

        return self._emit(planned, preempted)

    def update_from_output(self, sched_out: SchedulerOutput, sampled: Mapping[str, Sequence[int]]) -> list[Request]:
        """Apply a finished step: sampled ids (one per sampling request), stop checks, frees.

        Must be called once per ``SchedulerOutput``, in step order (empty outputs
        included; they need no model run). Returns the requests that got a token
        or finished (requests failed by ``schedule()`` included), in batch order.
        """
        if sched_out.is_empty:
            if sampled:
                raise ValueError(f"step {sched_out.step_id} scheduled nothing but got sampled tokens for {sorted(sampled)}")
            failed, self._failed = self._failed, []
            return failed
        if not self._pending or self._pending[0][0] != sched_out.step_id:
            expected = self._pending[0][0] if self._pending else None
            raise ValueError(f"update_from_output got step {sched_out.step_id}, expected step {expected}")
        entries = self._pending[0][1]
        self._check_sampled(entries, sampled)
        self._pending.popleft()

        updated, self._failed = self._failed, []
        for req, e in entries:
            if self.requests.get(e.req_id) is not req:
                continue  # finished (or aborted) since: its outputs are dropped
            current = e.epoch == req.num_preemptions
            if current:
                req.num_inflight_tokens -= e.num_scheduled_tokens
            if e.samples:
                req.num_output_placeholders -= 1 + e.num_draft_tokens
                tokens = sampled[e.req_id]
                if e.num_draft_tokens and current:  # rejected (or unfed) drafts: their positions are recomputed
                    req.num_computed_tokens -= e.num_draft_tokens + 1 - len(tokens)
                updated.append(req)
                status = None
                for token in tokens:
                    req.append_output_token(token)
                    status = self._stop_status(req, token)
                    if status is not None:
                        break
                if status is not None:
                    self._finish(req, status)
                    continue
            if current:
                self.kv.free_skipped_blocks(req)
        return updated

    def set_drafts(self, request_id: str, tokens: Sequence[int]) -> None:
        """Drafts for the positions after ``request_id``'s last token (from the runner's proposer)."""
        req = self.requests.get(request_id)
        if req is not None and req.status is RequestStatus.RUNNING:
            req.spec_token_ids = list(tokens[:self.spec_n])

    # -- internals ---------------------------------------------------------------
    def _alloc(self, req: Request, n: int) -> bool:
        """allocate_slots plus, when the chunk samples under speculative decoding, the N positions
        the proposer's draft block writes after it."""
        extra = self.spec_n if self.spec_n and req.num_computed_tokens + n >= req.num_known_tokens else 0
        return self.kv.allocate_slots(req, n + extra)

    def _draft_cap(self, req: Request) -> int:
        """Most drafts ``req`` may verify: every token it may emit must fit max_tokens / max_model_len.
        With a step in flight its drafts do not exist yet (the runner will have N)."""
        if req.num_known_tokens - req.num_computed_tokens != 1 or req.num_computed_tokens < req.num_prompt_tokens - 1:
            return 0
        cap = self.spec_n if req.num_output_placeholders else len(req.spec_token_ids)
        if req.max_tokens is not None:
            cap = min(cap, req.max_tokens - req.num_output_tokens - req.num_output_placeholders - 1)
        if self.config.max_model_len is not None:
            cap = min(cap, self.config.max_model_len - req.num_known_tokens - 1)
        return max(cap, 0)

    def _plan_drafts(self, budget: int) -> dict[str, int]:
        """Drafts each running decoding request may verify this step (an upper bound)."""
        # Room for every draft: confidence-scheduled verification trims them in the runner, which has
        # the fresh confidences (under async scheduling this plan precedes the drafts); vLLM likewise
        # schedules 1 + N and trims on the device.
        caps = {r.request_id: self._draft_cap(r) for r in self.running}
        return {rid: c for rid, c in caps.items() if c > 0}

    def _max_final_len(self, req: Request) -> int:
        """Longest the sequence can get (prompt + outputs); unbounded counts as prompt + 1."""
        lens = [req.num_prompt_tokens + (req.max_tokens if req.max_tokens is not None else 1)]
        if self.config.max_model_len is not None:
            lens.append(self.config.max_model_len)
        return min(lens)

    def _num_new_tokens(self, req: Request, budget: int) -> int:
        """Tokens to give ``req`` this step (0 = none), before KV allocation."""
        remaining = req.num_known_tokens - req.num_computed_tokens
        if remaining <= 0:
            return 0
        drafts = self._drafts_planned.get(req.request_id, 0)
        if drafts:
            return min(1 + drafts, budget)
        # Async: never run a step whose only result lies past the length limits.
        if req.max_tokens is not None and req.num_output_tokens + req.num_output_placeholders >= req.max_tokens:
            return 0
        if self.config.max_model_len is not None and req.num_known_tokens >= self.config.max_model_len:
            return 0
        chunkable = self.config.enable_chunked_prefill or remaining > self.config.max_num_batched_tokens
        n = min(remaining, budget)
        if chunkable and self.config.long_prefill_token_threshold:
            n = min(n, self.config.long_prefill_token_threshold)
        if n < remaining and not chunkable:
            return 0
        return n

    def _fit_alone(self, req: Request, n: int) -> int:
        """``req`` holds the only blocks in use: take the largest chunk ``< n`` that fits.

        Returns 0 if none fits: the request waits if a step of its own is in
        flight (processing it frees window blocks), else it fails for good.
        """
        lo, hi = 0, n - 1  # largest m in [1, n-1] with can_allocate; can_allocate is monotone in m
        while lo < hi:
            mid = (lo + hi + 1) // 2
            extra = self.spec_n if self.spec_n and req.num_computed_tokens + mid >= req.num_known_tokens else 0
            if self.kv.can_allocate(req, mid + extra):
                lo = mid
            else:
                hi = mid - 1
        if lo and self._alloc(req, lo):
            return lo
        if req.num_inflight_tokens == 0:
            req.error = (
                f"request {req.request_id!r} cannot make progress: one more token needs "
                f"{self.kv.blocks_needed(req, 1)} new KV blocks while it is the only request in a pool of "
                f"{self.kv.num_usable_blocks} usable blocks ({self.kv.num_free_blocks} free)"
            )
            self._finish(req, RequestStatus.FINISHED_ERROR)
            self._failed.append(req)
        return 0

    def _try_prefix_hit(self, req: Request) -> int:
        """Serve the longest cached prefix of a request that holds no blocks; returns tokens skipped."""
        if not self.kv.enable_caching or req.num_computed_tokens or self.kv.has_request(req.request_id):
            return 0
        h, r, tables = self.kv.find_prefix(req)
        if h == 0 or h - r <= 0 or not self.kv.allocate_prefix(req, tables):
            return 0
        req.num_computed_tokens = h - r
        req.cached_until = h
        floor = getattr(tables, "window_floor", 0)
        if floor:
            self._window_floor[req.request_id] = floor
        return h - r

    def _undo_prefix_hit(self, req: Request) -> None:
        self.kv.free(req)
        req.num_computed_tokens = 0
        req.cached_until = 0
        self._window_floor.pop(req.request_id, None)

    def _preempt(self, req: Request, preempted: list[str]) -> None:
        """Recompute preemption; the caller already removed ``req`` from ``running``."""
        self.kv.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_inflight_tokens = 0
        req.cached_until = 0
        self._window_floor.pop(req.request_id, None)
        req.spec_token_ids = []
        req.num_preemptions += 1  # new epoch: older in-flight steps become stale
        bisect.insort(self.waiting, req, key=_priority)
        preempted.append(req.request_id)

    def _finish(self, req: Request, status: RequestStatus) -> None:
        if req.status is RequestStatus.RUNNING:
            self.running.remove(req)
        else:
            self.waiting.remove(req)
        self.kv.free(req)
        self._window_floor.pop(req.request_id, None)
        req.status = status
        del self.requests[req.request_id]
        self._finished_ids.append(req.request_id)

    def _stop_status(self, req: Request, token: int) -> RequestStatus | None:
        """Stop checks the scheduler owns, after ``token`` was appended (stop strings are the caller's)."""
        if req.num_output_tokens >= req.min_tokens:
            if (not req.ignore_eos and token in req.eos_token_ids) or token in req.stop_token_ids:
                req.stop_reason = token
                return RequestStatus.FINISHED_STOPPED
        if req.max_tokens is not None and req.num_output_tokens >= req.max_tokens:
            return RequestStatus.FINISHED_LENGTH
        if self.config.max_model_len is not None and req.num_tokens >= self.config.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

    def _emit(self, planned: list[tuple[Request, int]], preempted: list[str]) -> SchedulerOutput:
        entries: list[tuple[Request, ScheduledRequest]] = []
        for req, n in planned:
            c = req.num_computed_tokens
            drafts = max(0, c + n - req.num_known_tokens)  # tokens past the last known one are drafts
            samples = c + n >= req.num_known_tokens
            ids = req.token_ids_slice(c, c + n - drafts)
            if drafts:  # the runner feeds its own drafts; these ids are informative (placeholders in flight)
                known = req.spec_token_ids[:drafts] if not req.num_output_placeholders else []
                ids += known + [PLACEHOLDER_TOKEN_ID] * (drafts - len(known))
            if self.spec_n:
                req.spec_token_ids = []  # consumed; the runner proposes anew
            e = ScheduledRequest(
                req_id=req.request_id,
                num_scheduled_tokens=n,
                num_computed_tokens=c,
                token_ids=ids,
                block_tables=self.kv.get_block_tables(req),
                state_slot=self.kv.state_slot(req),
                is_prefill=n > 1 or c < req.num_prompt_tokens,
                samples=samples,
                epoch=req.num_preemptions,
                cached_until=req.cached_until,
                num_draft_tokens=drafts,
                window_floor=self._window_floor.get(req.request_id, 0),
            )
            req.num_computed_tokens += n
            req.num_inflight_tokens += n
            if samples:
                req.num_output_placeholders += 1 + drafts
            entries.append((req, e))
        out = SchedulerOutput(
            step_id=self._next_step,
            scheduled=[e for _, e in entries],
            preempted_req_ids=preempted,
            finished_req_ids=self._finished_ids,
        )
        self._finished_ids = []
        self._next_step += 1
        if entries:
            self._pending.append((out.step_id, entries))
        return out

    def _check_sampled(
        self, entries: list[tuple[Request, ScheduledRequest]], sampled: Mapping[str, Sequence[int]]
    ) -> None:
        """Validate the runner's tokens before touching any state."""
        sampling = {e.req_id for _, e in entries if e.samples}
        extra = set(sampled) - sampling
        if extra:
            raise ValueError(f"sampled tokens for requests that did not sample in this step: {sorted(extra)}")
        for req, e in entries:
            if not e.samples or self.requests.get(e.req_id) is not req:
                continue
            toks = sampled.get(e.req_id)
            if toks is None:
                raise ValueError(f"no sampled token for request {e.req_id!r}, which sampled in step")
            if not 1 <= len(toks) <= 1 + e.num_draft_tokens:
                raise ValueError(f"request {e.req_id!r}: expected 1..{1 + e.num_draft_tokens} sampled tokens "
                                 f"({e.num_draft_tokens} drafts verified), got {len(toks)}")
            for t in toks:
                if isinstance(t, bool) or not isinstance(t, int) or t < 0:
                    raise ValueError(f"request {e.req_id!r}: sampled token must be a non-negative int, got {t!r}")
