"""Incremental detokenisation with stop strings, for streaming outputs.

Why this is not ``decode(new_id)``: DeepSeek-V4 uses byte-level BPE, so one CJK
character or emoji (3-4 UTF-8 bytes) is often split over two or three tokens, and a
lone token decodes to U+FFFD.  Re-decoding the whole output each step is correct but
quadratic.

Technique (offset windows): keep two indices into the id list, ``prefix`` <= ``read``.
Each step decode ``ids[prefix:read]`` (text already emitted, used only for its length)
and ``ids[prefix:]``.  If the longer decode grew and does not end in U+FFFD, the extra
characters are final: emit them and slide the window (``prefix, read = read, len``).
Otherwise the last token ends inside a character: wait for more ids.  Decoding a
window that starts mid-character yields the same leading U+FFFD in both decodes, so
the difference is still exact.  A few prompt ids seed the window so tokenizers whose
decoder depends on the left context (leading-space rules) decode the first output
token correctly.

Stop strings: the text is searched only where a new match can be (the last
``max_len - 1`` old characters plus the new ones), the earliest match wins, and the
text is cut before it (or after it with ``include_stop_str_in_output``).  Because a
stop string may start in text that is already decoded, up to ``max_len - 1`` trailing
characters are held back from the deltas until they can no longer begin a match;
``finish()`` releases them.  So the concatenated deltas never need retracting and,
after ``finish()``, equal ``output_text``.
"""
from __future__ import annotations

from typing import Sequence

from deepinfer_core.tokenizer import Tokenizer

# Prompt ids kept as left context for the first window (see module docstring).
_PROMPT_CONTEXT = 6
# Drop consumed ids from the window buffer once this many pile up.
_TRIM_AT = 256
_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Turns a stream of output token ids into text deltas, stopping at stop strings.

    Args:
        tokenizer: the request's ``Tokenizer``.
        prompt_ids: the prompt's token ids (only the last few are kept, as context).
        skip_special_tokens: drop special tokens (bos/eos/...) from the text.
        stop: stop strings; generation text ends at the first occurrence of any.
        include_stop_str_in_output: keep the matched stop string in the text.

    Use ``add_tokens(ids)`` once per engine step, then ``finish()`` once when the
    request ends for any reason other than a stop string (eos, length, abort) to get
    the held-back tail.  Ids added after a stop string was hit are ignored.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_ids: Sequence[int],
        skip_special_tokens: bool = True,
        stop: Sequence[str] | None = None,
        include_stop_str_in_output: bool = False,
    ):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.stop = _check_stop(stop)
        self.include_stop_str_in_output = include_stop_str_in_output
        max_stop = max((len(s) for s in self.stop), default=0)
        # Characters that might still be the start of a stop string; none need
        # holding when the stop string is kept in the output anyway.
        self._hold = 0 if include_stop_str_in_output else max(max_stop - 1, 0)
        self._max_stop = max_stop

        self._ids: list[int] = [int(i) for i in list(prompt_ids)[-_PROMPT_CONTEXT:]]
        self._prefix = 0
        self._read = len(self._ids)
        self._text = ""
        self._emitted = 0
        self.stop_hit: str | None = None
        self._finished = False

    # -- public --------------------------------------------------------------------
    @property
    def output_text(self) -> str:
        """All final output text so far (cut at a stop string), held-back tail included."""
        return self._text

    @property
    def finished(self) -> bool:
        """True once a stop string was hit or ``finish()`` was called."""
        return self._finished or self.stop_hit is not None

    def add_tokens(self, new_ids: Sequence[int]) -> tuple[str, str | None]:
        """Feed newly sampled ids; returns ``(text_delta, stop_string_hit_or_None)``.

        ``text_delta`` is the text that became final with these ids (possibly "").
        When a stop string is hit it is returned and the delta runs up to the cut.
        """
        if self._finished:
            raise RuntimeError("add_tokens() called after finish() on this detokenizer")
        if self.stop_hit is not None:
            return "", None
        ids = self._check_new_ids(new_ids)
        old_len = len(self._text)
        for tid in ids:
            self._ids.append(tid)
            self._text += self._step()
        stop = self._check_stop_strings(old_len)
        return self._release(final=stop is not None), stop

    def finish(self) -> str:
        """End the stream; returns the remaining delta (held-back tail, pending bytes).

        Pending ids that end inside a UTF-8 character are decoded with U+FFFD, like a
        full decode would.  Calling it again returns "".
        """
        if self._finished:
            return ""
        self._finished = True
        if self.stop_hit is not None:
            return self._release(final=True)
        old_len = len(self._text)
        if len(self._ids) > self._read:
            prefix_text = self._decode(self._prefix, self._read)
            full_text = self._decode(self._prefix, len(self._ids))
            if len(full_text) > len(prefix_text):
                self._text += full_text[len(prefix_text):]
            self._prefix = self._read = len(self._ids)
        self._check_stop_strings(old_len)
        return self._release(final=True)

    # -- internals -----------------------------------------------------------------
    def _decode(self, start: int, end: int) -> str:
        return self.tokenizer.decode(self._ids[start:end], skip_special_tokens=self.skip_special_tokens)

    def _step(self) -> str:
        """Text made final by the id just appended (see module docstring)."""
        prefix_text = self._decode(self._prefix, self._read)
        full_text = self._decode(self._prefix, len(self._ids))
        if len(full_text) <= len(prefix_text) or full_text.endswith(_REPLACEMENT):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        if self._prefix >= _TRIM_AT:
            del self._ids[: self._prefix]
            self._read -= self._prefix
            self._prefix = 0
        return full_text[len(prefix_text):]

    def _check_stop_strings(self, old_len: int) -> str | None:
        """Search the text that could hold a new match; cut the text at the earliest one."""
        if not self.stop or len(self._text) == old_len:
            return None
        start = max(0, old_len - self._max_stop + 1)
        best_idx, best = -1, None
        for s in self.stop:
            idx = self._text.find(s, start)
            if idx != -1 and (best is None or idx < best_idx):
                best_idx, best = idx, s
        if best is None:
            return None
        end = best_idx + len(best) if self.include_stop_str_in_output else best_idx
        self._text = self._text[:end]
        self.stop_hit = best
        return best

    def _release(self, final: bool) -> str:
        limit = len(self._text) if final else len(self._text) - self._hold
        if limit <= self._emitted:
            return ""
        delta = self._text[self._emitted : limit]
        self._emitted = limit
        return delta

    def _check_new_ids(self, new_ids: Sequence[int]) -> list[int]:
        vocab = self.tokenizer.vocab_size
        out = []
        for pos, i in enumerate(new_ids):
            try:
                v = int(i)
            except (TypeError, ValueError):
                raise TypeError(f"new token id at position {pos} is {i!r}, not an int") from None
            if isinstance(i, bool) or v != i or not 0 <= v < vocab:
                raise ValueError(f"new token id {i!r} at position {pos} is not an id in [0, {vocab})")
            out.append(v)
        return out


def _check_stop(stop: Sequence[str] | None) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        return _check_stop([stop])
    out = []
    for i, s in enumerate(stop):
        if not isinstance(s, str):
            raise TypeError(f"stop[{i}] must be a str, got {type(s).__name__}")
        if not s:
            raise ValueError(f"stop[{i}] is an empty string; stop strings must be non-empty")
        out.append(s)
    return out
