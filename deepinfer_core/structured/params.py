"""``StructuredOutputsParams``: vLLM's shape for constrained decoding requests."""
from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

KINDS = ("json", "json_object", "regex", "grammar", "choice")


@dataclass(frozen=True)
class StructuredOutputsParams:
    """Exactly one of the fields is set.

    json: a JSON schema (dict or JSON string); json_object: any JSON object (True);
    regex: a regular expression; grammar: an EBNF/GBNF grammar (xgrammar syntax, root rule ``root``);
    choice: a list of strings, the output is exactly one of them.
    """

    json: dict | str | None = None
    json_object: bool | None = None
    regex: str | None = None
    grammar: str | None = None
    choice: list[str] | tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        set_ = [f.name for f in fields(self) if getattr(self, f.name) not in (None, False)]
        if len(set_) != 1:
            raise ValueError(f"structured_outputs needs exactly one of {', '.join(KINDS)}; got {set_ or 'none'}")
        if self.choice is not None:
            if not self.choice or not all(isinstance(c, str) and c for c in self.choice):
                raise ValueError("structured_outputs.choice must be a non-empty list of non-empty strings")
        for name in ("regex", "grammar"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, str) or not v.strip()):
                raise ValueError(f"structured_outputs.{name} must be a non-empty string")
        if self.json is not None and not isinstance(self.json, (dict, str)):
            raise ValueError(f"structured_outputs.json must be a dict or a JSON string, got {type(self.json).__name__}")

    @property
    def kind(self) -> str:
        return next(f.name for f in fields(self) if getattr(self, f.name) not in (None, False))

    def key(self) -> tuple[str, str]:
        """A hashable cache key (kind, canonical spec text)."""
        kind = self.kind
        if kind == "json":
            spec = self.json if isinstance(self.json, str) else json.dumps(self.json, sort_keys=True)
        elif kind == "choice":
            spec = json.dumps(list(self.choice))
        elif kind == "json_object":
            spec = ""
        else:
            spec = getattr(self, kind)
        return kind, spec

    @classmethod
    def coerce(cls, value: Any) -> "StructuredOutputsParams":
        """Accept the params object itself or a dict like ``{"json": schema}``."""
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            unknown = set(value) - set(KINDS)
            if unknown:
                raise ValueError(f"unknown structured_outputs keys {sorted(unknown)}; expected one of {KINDS}")
            return cls(**value)
        raise ValueError(f"structured_outputs must be a StructuredOutputsParams or a dict, got {type(value).__name__}")
