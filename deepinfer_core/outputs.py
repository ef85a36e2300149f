"""vLLM-shaped result types returned by ``LLM.generate`` / ``LLM.chat`` and streamed by the server.

Field names and meanings follow vLLM's public ``RequestOutput`` / ``CompletionOutput``
so user code written for vLLM reads DeepInfer results unchanged:

- ``CompletionOutput``: one of the ``n`` samples of a request.
- ``RequestOutput``: everything about one request at one point in time (streamed
  outputs carry the text so far; ``finished`` flips once).
- ``Logprob``: one candidate token's log-probability at one position.

``finish_reason``: ``"stop"`` (eos, a stop token id or a stop string), ``"length"``
(max_tokens or the context limit), ``"abort"`` (cancelled by the user/server), or
``"error"`` (the request failed; ``RequestOutput.error`` holds the message).
``stop_reason`` says which stop: the stop string (str) or stop token id (int); None for
eos or when not stopped.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FINISH_REASONS = frozenset({"stop", "length", "abort", "error"})

# One dict per generated position: candidate token id -> its Logprob.
SampleLogprobs = list[dict[int, "Logprob"]]
# Like SampleLogprobs, for prompt positions; the first position has none (None).
PromptLogprobs = list[dict[int, "Logprob"] | None]


@dataclass
class Logprob:
    """Log-probability of one token at one position.

    ``rank`` is the 1-based rank of the token in the sampling distribution (1 = most
    likely); ``decoded_token`` its text when detokenisation is on.
    """

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    """One generated sequence of a request.

    ``token_ids``: the generated ids (prompt excluded). ``cumulative_logprob``: sum of the
    sampled tokens' logprobs, None when logprobs were not requested. ``logprobs``: one
    dict per generated token when requested, else None.
    """

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: SampleLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def __post_init__(self) -> None:
        if self.finish_reason is not None and self.finish_reason not in FINISH_REASONS:
            raise ValueError(
                f"finish_reason must be one of {sorted(FINISH_REASONS)} or None, got {self.finish_reason!r}"
            )
        if self.stop_reason is not None and (
            isinstance(self.stop_reason, bool) or not isinstance(self.stop_reason, (int, str))
        ):
            raise TypeError(f"stop_reason must be a stop string, a token id or None, got {self.stop_reason!r}")

    def finished(self) -> bool:
        """True once this sequence has a finish reason."""
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """The state of one request: prompt, its ``n`` completions, and whether it is done.

    ``metrics`` is engine-defined timing/counter data (or None); ``error`` is set, with
    every output's finish_reason ``"error"``, when the request failed.
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int] | None
    prompt_logprobs: PromptLogprobs | None
    outputs: list[CompletionOutput]
    finished: bool
    metrics: Any | None = None
    error: str | None = None
    # Prompt tokens served from the prefix cache (vLLM reports the same field).
    num_cached_tokens: int | None = None

    def __post_init__(self) -> None:
        for i, out in enumerate(self.outputs):
            if not isinstance(out, CompletionOutput):
                raise TypeError(f"outputs[{i}] must be a CompletionOutput, got {type(out).__name__}")
        if self.error is not None and not isinstance(self.error, str):
            raise TypeError(f"error must be a str or None, got {type(self.error).__name__}")
