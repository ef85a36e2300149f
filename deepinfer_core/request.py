"""Request: one sequence's scheduling state (token ids, progress counters, status).

One ``Request`` per generated sequence: the front end expands ``n > 1`` into
``n`` child requests. Everything here is plain Python on the CPU.

Counters (all in tokens, see also ``scheduler.py``):

- ``num_tokens`` = prompt + outputs received so far (``all_token_ids``).
- ``num_computed_tokens``: tokens whose KV is written or scheduled to be written.
  It advances when a step is *scheduled*, so under async scheduling it runs
  ahead of the truth by the tokens of in-flight steps.
- ``num_inflight_tokens``: the part of ``num_computed_tokens`` whose step has not
  reported back yet; ``num_processed_tokens`` is the rest (what KV freeing trusts).
- ``num_output_placeholders``: sampled tokens in flight (scheduled steps that end
  at the last known token and whose sampled id has not arrived). The known
  sequence length is ``num_tokens + num_output_placeholders``.
- ``num_preemptions``: also the *epoch*: a step scheduled before a preemption is
  stale, its counters must not touch the reset request.
"""
from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

# Stands for a sampled token id that is still on the device (async scheduling).
PLACEHOLDER_TOKEN_ID = -1


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "finished_stopped"
    FINISHED_LENGTH = "finished_length"
    FINISHED_ABORTED = "finished_aborted"
    FINISHED_ERROR = "finished_error"

    @property
    def is_finished(self) -> bool:
        return self in _FINISH_REASONS

    @property
    def finish_reason(self) -> str | None:
        """vLLM/OpenAI finish reason: "stop", "length", "abort", "error"; None while unfinished."""
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class Request:
    """One sequence. ``sampling_params`` is read duck-typed for the fields the scheduler owns.

    Read: ``max_tokens`` (None = until ``max_model_len``), ``min_tokens`` (EOS and
    stop token ids do not stop before this many outputs), ``ignore_eos``,
    ``stop_token_ids``. Stop *strings* are the caller's (``Scheduler.finish_request``).
    ``arrival`` orders requests (FCFS): lower first, ties broken by add order.
    ``eos_token_id`` may be one id, several, or None.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling_params: Any,
        arrival: float = 0.0,
        eos_token_id: int | Sequence[int] | None = None,
    ) -> None:
        if not isinstance(request_id, str) or not request_id:
            raise TypeError(f"request_id must be a non-empty str, got {request_id!r}")
        prompt = list(prompt_token_ids)
        if not prompt:
            raise ValueError(f"request {request_id!r}: prompt_token_ids is empty")
        for i, t in enumerate(prompt):
            if not _is_int(t) or t < 0:
                raise ValueError(f"request {request_id!r}: prompt_token_ids[{i}] must be a non-negative int, got {t!r}")
        if isinstance(arrival, bool) or not isinstance(arrival, (int, float)):
            raise TypeError(f"request {request_id!r}: arrival must be a number, got {type(arrival).__name__}")
        self.request_id = request_id
        self.sampling_params = sampling_params
        self.arrival = arrival
        self.eos_token_ids: frozenset[int] = _as_id_set("eos_token_id", request_id, eos_token_id)
        self._read_sampling_params(sampling_params)

        self.prompt_token_ids: list[int] = prompt
        self.output_token_ids: list[int] = []
        self._all_token_ids: list[int] = list(prompt)
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        self.num_inflight_tokens = 0
        self.num_output_placeholders = 0
        self.num_preemptions = 0
        self.cached_until = 0  # positions below this come from the prefix cache: no cache writes
        # Speculative decoding: drafts for the positions after the last token (set by the engine
        # after every step, consumed by the next schedule()).
        self.spec_token_ids: list[int] = []
        self.stop_reason: int | None = None  # the stop/eos token id that finished it
        self.error: str | None = None  # why it ended in FINISHED_ERROR
        self.seq = -1  # add order, set by the scheduler

    def _read_sampling_params(self, sp: Any) -> None:
        rid = self.request_id
        self.max_tokens: int | None = getattr(sp, "max_tokens", None)
        if self.max_tokens is not None and (not _is_int(self.max_tokens) or self.max_tokens < 1):
            raise ValueError(f"request {rid!r}: max_tokens must be None or an int >= 1, got {self.max_tokens!r}")
        self.min_tokens: int = getattr(sp, "min_tokens", 0) or 0
        if not _is_int(self.min_tokens) or self.min_tokens < 0:
            raise ValueError(f"request {rid!r}: min_tokens must be an int >= 0, got {self.min_tokens!r}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"request {rid!r}: min_tokens {self.min_tokens} exceeds max_tokens {self.max_tokens}")
        self.ignore_eos: bool = bool(getattr(sp, "ignore_eos", False))
        self.stop_token_ids: frozenset[int] = _as_id_set("stop_token_ids", rid, getattr(sp, "stop_token_ids", None))

    # -- token views -------------------------------------------------------------
    @property
    def all_token_ids(self) -> list[int]:
        """Prompt + outputs received so far. The live list: read it, never mutate it."""
        return self._all_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self._all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_known_tokens(self) -> int:
        """Tokens whose id is known or in flight: ``num_tokens + num_output_placeholders``."""
        return len(self._all_token_ids) + self.num_output_placeholders

    @property
    def num_processed_tokens(self) -> int:
        """Computed tokens whose step has reported back (``num_computed - num_inflight``)."""
        return self.num_computed_tokens - self.num_inflight_tokens

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    def token_ids_slice(self, start: int, end: int) -> list[int]:
        """Ids of positions ``[start, end)``; positions past ``num_tokens`` are ``PLACEHOLDER_TOKEN_ID``."""
        if not 0 <= start <= end <= self.num_known_tokens:
            raise ValueError(
                f"request {self.request_id!r}: slice [{start}, {end}) outside the {self.num_known_tokens} known tokens"
            )
        ids = self._all_token_ids[start:end]
        return ids + [PLACEHOLDER_TOKEN_ID] * (end - start - len(ids))

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self._all_token_ids.append(token_id)

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, status={self.status.name}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, outputs={self.num_output_tokens})"
        )


def _as_id_set(name: str, request_id: str, value: int | Sequence[int] | None) -> frozenset[int]:
    if value is None:
        return frozenset()
    ids = [value] if _is_int(value) else list(value)
    for t in ids:
        if not _is_int(t) or t < 0:
            raise ValueError(f"request {request_id!r}: {name} must hold non-negative ints, got {t!r}")
    return frozenset(ids)
