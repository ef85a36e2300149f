"""SamplingParams: per-request generation settings with vLLM's names and defaults.

The object is a plain mutable dataclass (like vLLM's). ``__post_init__``
normalises a few fields and then runs ``validate()``, which raises
``ValueError`` (bad value) or ``TypeError`` (wrong type) with a message that
names the field and the offending value. Call ``validate()`` again after
mutating a field by hand.

Normalisations (all vLLM-compatible): ``stop`` becomes a list of strings
(``None`` -> ``[]``, ``"x"`` -> ``["x"]``); ``stop_token_ids`` becomes a list
without duplicates (``None`` -> ``[]``); ``seed=-1`` means no seed;
``logprobs=True`` / ``prompt_logprobs=True`` mean 1.

Deliberate differences from vLLM: a tiny positive temperature is kept as given
(vLLM raises it to 0.01; DeepInfer's sampler is stable at any temperature >=
1e-5 and below that samples greedily), and there is no upper bound on
temperature.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

# Temperatures below this mean greedy sampling (argmax), as in vLLM.
SAMPLING_EPS = 1e-5


def _is_int(value: Any) -> bool:
    # bool is an int subclass; True as a token count is almost surely a bug.
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass
class SamplingParams:
    """Generation settings of one request (vLLM ``SamplingParams`` subset).

    n: sequences to generate for the prompt. temperature: 0 (< 1e-5) = greedy.
    top_p in (0, 1]; top_k: 0 or -1 = off; min_p in [0, 1] relative to the top
    token's probability. seed: per-request seed; the request's tokens then
    depend only on the seed and its own logits (not on batch composition).
    max_tokens: None = until the context is full. min_tokens: EOS and
    stop_token_ids are masked until that many tokens exist. logprobs: number
    of top logprobs per output token (the sampled token's logprob is always
    added; -1 = whole vocabulary); prompt_logprobs: the same for prompt tokens.
    Penalties follow vLLM: presence/frequency over output tokens in [-2, 2],
    repetition over prompt+output tokens, > 0. structured_outputs: a
    StructuredOutputsParams or a dict (json, json_object, regex, grammar, choice),
    normalised by validate(); the grammar itself is compiled by the engine. It is
    shared, not copied, by ``clone()``.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    structured_outputs: Any = None
    detokenize: bool = True

    def __post_init__(self) -> None:
        self._normalise()
        self.validate()

    # -- normalisation --------------------------------------------------------
    def _normalise(self) -> None:
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        elif isinstance(self.stop, (list, tuple)):
            self.stop = list(self.stop)
        else:
            raise TypeError(f"stop must be a str, a list of str or None, got {type(self.stop).__name__}")

        if self.stop_token_ids is None:
            self.stop_token_ids = []
        elif isinstance(self.stop_token_ids, (list, tuple)):
            # Keep first occurrences in order; duplicates carry no meaning.
            self.stop_token_ids = list(dict.fromkeys(self.stop_token_ids))
        else:
            raise TypeError(
                f"stop_token_ids must be a list of int or None, got {type(self.stop_token_ids).__name__}"
            )

        if self.seed == -1 and _is_int(self.seed):
            self.seed = None
        if self.logprobs is True:
            self.logprobs = 1
        if self.prompt_logprobs is True:
            self.prompt_logprobs = 1

    # -- validation -----------------------------------------------------------
    def validate(self) -> None:
        """Raise ValueError/TypeError naming the first bad field; no-op when valid."""
        self._check_types()
        if self.structured_outputs is not None:
            from deepinfer_core.structured.params import StructuredOutputsParams

            # normalise a dict like {"json": schema} once; shape errors name the field
            object.__setattr__(self, "structured_outputs", StructuredOutputsParams.coerce(self.structured_outputs))
        if self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n}")
        if not math.isfinite(self.temperature):
            raise ValueError(f"temperature must be a finite number, got {self.temperature}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be non-negative, got {self.temperature}")
        if not (math.isfinite(self.top_p) and 0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be 0 or -1 (disabled) or at least 1, got {self.top_k}")
        if not (math.isfinite(self.min_p) and 0.0 <= self.min_p <= 1.0):
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0.0):
            raise ValueError(f"repetition_penalty must be a finite number > 0, got {self.repetition_penalty}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not (math.isfinite(value) and -2.0 <= value <= 2.0):
                raise ValueError(f"{name} must be in [-2, 2], got {value}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be non-negative, got {self.min_tokens}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens must be at most max_tokens={self.max_tokens}, got {self.min_tokens}"
            )
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and value < -1:
                raise ValueError(f"{name} must be non-negative (or -1 for the whole vocabulary), got {value}")
        for i, token_id in enumerate(self.stop_token_ids):
            if token_id < 0:
                raise ValueError(f"stop_token_ids must be non-negative, got {token_id} at index {i}")
        for i, s in enumerate(self.stop):
            if s == "":
                raise ValueError(f"stop strings must be non-empty, got an empty string at index {i}")
        if self.stop and not self.detokenize:
            raise ValueError("stop strings need detokenize=True (they are matched on the decoded text)")
        if self.greedy and self.n > 1:
            raise ValueError(f"n must be 1 when sampling greedily (temperature < {SAMPLING_EPS}), got n={self.n}")

    def _check_types(self) -> None:
        for name in ("n", "top_k", "min_tokens"):
            if not _is_int(getattr(self, name)):
                raise TypeError(f"{name} must be an int, got {type(getattr(self, name)).__name__}")
        for name in ("seed", "max_tokens", "logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and not _is_int(value):
                raise TypeError(f"{name} must be an int or None, got {type(value).__name__}")
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                     "repetition_penalty"):
            if not _is_real(getattr(self, name)):
                raise TypeError(f"{name} must be a number, got {type(getattr(self, name)).__name__}")
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens",
                     "spaces_between_special_tokens", "detokenize"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {type(getattr(self, name)).__name__}")
        if not isinstance(self.stop, list) or not all(isinstance(s, str) for s in self.stop):
            raise TypeError(f"stop must be a str or a list of str, got {self.stop!r}")
        if not isinstance(self.stop_token_ids, list) or not all(_is_int(t) for t in self.stop_token_ids):
            raise TypeError(f"stop_token_ids must be a list of int, got {self.stop_token_ids!r}")

    # -- derived --------------------------------------------------------------
    @property
    def greedy(self) -> bool:
        """True when the request samples greedily (temperature < 1e-5)."""
        return self.temperature < SAMPLING_EPS

    @property
    def top_k_enabled(self) -> bool:
        return self.top_k > 0

    @property
    def has_penalties(self) -> bool:
        """Any of the three penalties differs from its neutral value."""
        return (self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0
                or self.presence_penalty != 0.0)

    def clone(self) -> "SamplingParams":
        """An independent copy (lists copied; ``structured_outputs`` shared)."""
        new = copy.copy(self)
        new.stop = list(self.stop)
        new.stop_token_ids = list(self.stop_token_ids)
        return new
