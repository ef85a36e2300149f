"""xgrammar-backed grammars: tokenizer info once per tokenizer, compiled grammars cached
by (kind, spec), one matcher per sequence.

Compilation happens when a request is added (never inside a model step); xgrammar's own
compiler cache plus ours keyed by ``StructuredOutputsParams.key()`` make repeats free.
"""
from __future__ import annotations

import json
import re
import threading

import torch

from deepinfer_core.structured.params import StructuredOutputsParams


class GrammarError(ValueError):
    """The schema / regex / grammar / choice of a request is invalid."""


def _choice_grammar(choices) -> str:
    alts = " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)
    return f"root ::= {alts}"


class GrammarBackend:
    """Owns the xgrammar TokenizerInfo and GrammarCompiler for one tokenizer and vocabulary size."""

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: list[int], max_rollback_tokens: int = 8):
        import xgrammar as xgr  # optional dependency: imported only when a request asks for structure

        self._xgr = xgr
        backend = tokenizer.backend
        n = backend.get_vocab_size(with_added_tokens=True)
        encoded: list[str] = [""] * n
        for tok, tid in backend.get_vocab(with_added_tokens=True).items():
            if tid < n:
                encoded[tid] = tok
        # Added tokens (chat control tokens, BOS/EOS...) are never text a grammar may produce:
        # xgrammar treats empty entries as special and only allows them as stop tokens.
        for tid in backend.get_added_tokens_decoder():
            if tid < n:
                encoded[tid] = ""
        self.vocab_size = vocab_size
        self.info = xgr.TokenizerInfo(encoded, xgr.VocabType.BYTE_LEVEL, vocab_size=vocab_size,
                                      stop_token_ids=list(stop_token_ids))
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=2, cache_enabled=True)
        self.max_rollback_tokens = max_rollback_tokens
        self._cache: dict[tuple[str, str], object] = {}
        self._lock = threading.Lock()

    @property
    def bitmask_words(self) -> int:
        return (self.vocab_size + 31) // 32

    def compile(self, params: StructuredOutputsParams):
        key = params.key()
        with self._lock:
            if key in self._cache:
                return self._cache[key]
        kind, spec = key
        try:
            if kind == "json":
                json.loads(spec)  # a clear error for a malformed JSON string
                compiled = self.compiler.compile_json_schema(spec, any_whitespace=False, strict_mode=True)
            elif kind == "json_object":
                compiled = self.compiler.compile_json_schema(json.dumps({"type": "object"}), any_whitespace=False, strict_mode=False)
            elif kind == "regex":
                re.compile(spec)
                compiled = self.compiler.compile_regex(spec)
            elif kind == "grammar":
                compiled = self.compiler.compile_grammar(spec)
            else:
                compiled = self.compiler.compile_grammar(_choice_grammar(json.loads(spec)))
        except Exception as exc:  # xgrammar raises RuntimeError/ValueError subclasses with its parser message
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise GrammarError(f"invalid structured_outputs.{kind}: {msg}") from None
        with self._lock:
            self._cache[key] = compiled
        return compiled

    def matcher(self, compiled):
        # xgrammar >= 0.2 keeps unlimited rollback history; rollback(n) undoes accepted tokens.
        return self._xgr.GrammarMatcher(compiled)

    def fill_bitmask(self, matchers: list, rows: list[int], batch: int) -> torch.Tensor:
        """int32 [batch, words] bitmask: all ones (allowed) except rows filled by their matcher."""
        bitmask = torch.full((batch, self.bitmask_words), -1, dtype=torch.int32)
        for m, r in zip(matchers, rows):
            m.fill_next_token_bitmask(bitmask, r)
        return bitmask

    def fill_bitmask_drafts(self, entries: list[tuple], batch: int) -> tuple[torch.Tensor, list[int]]:
        """Speculative rows. entries: (matcher, first row, drafts d_1..d_L): row ``first + i`` gets the
        mask after accepting ``d_1..d_i``. Returns (int32 [batch, words] bitmask, per entry the
        number of leading drafts the grammar allows; rows past that are left all-allowed and must
        not be used). Every matcher is rolled back to where it was."""
        bitmask = torch.full((batch, self.bitmask_words), -1, dtype=torch.int32)
        valid = []
        for m, first, drafts in entries:
            m.fill_next_token_bitmask(bitmask, first)
            valid.append(allowed_prefix(m, drafts, lambda i, m=m, first=first: m.fill_next_token_bitmask(bitmask, first + i)))
        return bitmask, valid


def allowed_prefix(matcher, tokens, after_accept=None) -> int:
    """How many leading ``tokens`` the grammar accepts from the matcher's state (which is restored).
    ``after_accept(i)`` runs after the i-th accepted token while the grammar is not complete."""
    ok = 0
    for t in tokens:
        if matcher.is_terminated() or not matcher.accept_token(t):
            break
        ok += 1
        if after_accept is not None and not matcher.is_terminated():  # a complete grammar ends the request here
            after_accept(ok)
    if ok:
        matcher.rollback(ok)
    return ok
