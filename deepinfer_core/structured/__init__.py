"""Structured outputs (regex, JSON schema, EBNF grammar, choice) through xgrammar."""
from deepinfer_core.structured.params import StructuredOutputsParams

__all__ = ["StructuredOutputsParams"]
