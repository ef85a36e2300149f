"""SpeculativeConfig: what ``LLM(speculative_config={...})`` accepts (vLLM's names where it has one)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deepinfer_core.spec_decode.cost_model import is_batched_table, parse_cost_table

METHODS = ("dspark",)
DRAFT_SAMPLE_METHODS = ("greedy", "probabilistic")


@dataclass(frozen=True)
class SpeculativeConfig:
    """method: the proposer ("dspark": the checkpoint's ``mtp.*`` draft stages).

    num_speculative_tokens: drafts per step (None: the checkpoint's ``dspark_block_size``, else 5).
    draft_sample_method: "greedy" drafts (argmax; the verification coin is then ``p(d)``) or
      "probabilistic" (drawn from the draft's own distribution at the request's temperature).
    confidence_scheduling: verify only the global top-b (request, position) drafts by survival
      (running product of the confidence head's outputs), b maximising expected tokens per
      second under the step-time model; True = trim whenever the model predicts any gain;
      "auto" = on when the checkpoint has a confidence head, trimming only steps where the model
      predicts >= 5% more tokens/s than verifying every draft (``confidence.AUTO_MARGIN``).
    cost_table: the step-time model. ``{R: {step tokens: seconds}}`` (per decoding batch size R;
      ``cost_model.py`` documents the JSON file format), ``{step tokens: seconds}`` (one curve for
      every batch size), a path to a JSON file of either, "profile" (measure it at engine start:
      ``profile.py``, some seconds), or None = learn it online from measured decode steps
      (median per cell, minimum samples, monotone fit; non-deterministic budgets). Lossless either way.
    min_batch_for_confidence: below this many decoding requests every draft is verified
      (at low load the verify cost is flat, so trimming cannot pay).
    """

    method: str = "dspark"
    num_speculative_tokens: int | None = None
    draft_sample_method: str = "greedy"
    confidence_scheduling: bool | str = "auto"
    cost_table: dict | str | None = None
    min_batch_for_confidence: int = 1
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"speculative_config: method must be one of {METHODS}, got {self.method!r}")
        n = self.num_speculative_tokens
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 16):
            raise ValueError(f"speculative_config: num_speculative_tokens must be an int in [1, 16], got {n!r}")
        if self.draft_sample_method not in DRAFT_SAMPLE_METHODS:
            raise ValueError(f"speculative_config: draft_sample_method must be one of {DRAFT_SAMPLE_METHODS}, "
                             f"got {self.draft_sample_method!r}")
        if self.confidence_scheduling not in (True, False, "auto"):
            raise ValueError("speculative_config: confidence_scheduling must be True, False or 'auto', "
                             f"got {self.confidence_scheduling!r}")
        m = self.min_batch_for_confidence
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ValueError(f"speculative_config: min_batch_for_confidence must be an int >= 1, got {m!r}")
        if self.cost_table is not None and self.cost_table != "profile":
            table = self.cost_table
            rows = table.values() if is_batched_table(table) else [table] if isinstance(table, dict) else None
            if not table or rows is None or any(
                    not row or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 or not float(v) > 0
                                   for k, v in row.items()) for row in rows):
                raise ValueError("speculative_config: cost_table must map step token counts (int >= 1) to "
                                 f"positive seconds (optionally per batch size), or be 'profile', got {table!r}")

    @classmethod
    def from_user(cls, value: Any) -> "SpeculativeConfig | None":
        """None / a SpeculativeConfig / a dict (``cost_table`` may be a JSON path) -> config."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if not isinstance(value, dict):
            raise ValueError(f"speculative_config must be a dict, got {type(value).__name__}")
        known = {f for f in cls.__dataclass_fields__ if f != "extra"}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"speculative_config: unknown keys {unknown} (known: {sorted(known)})")
        kw = dict(value)
        table = kw.get("cost_table")
        if isinstance(table, (str, Path)) and table != "profile":
            kw["cost_table"] = load_cost_table(table)
        elif isinstance(table, dict):
            try:
                kw["cost_table"] = parse_cost_table(table)
            except (TypeError, ValueError, AttributeError) as exc:
                raise ValueError(f"speculative_config: bad cost_table {table!r}: {exc}") from None
        return cls(**kw)


def load_cost_table(path: str | Path) -> dict:
    """A JSON file: the profiled format (``cost_model.py``, as ``benchmarks/spec_decode.py --profile``
    writes) -> ``{R: {tokens: seconds}}``, or a plain ``{"tokens": seconds}`` map."""
    try:
        return parse_cost_table(json.loads(Path(path).read_text()))
    except (OSError, ValueError, AttributeError, TypeError) as exc:
        raise ValueError(f"speculative_config: cannot read cost_table {str(path)!r}: {exc}") from None
