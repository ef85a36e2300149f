"""Engram hashing constants, built once at load (MODEL_SPEC.md 3.9; docs/models/deepseek_v41_deltas.md 3.9).

- ``build_token_map``: token id -> compressed id. Every id of the checkpoint's tokenizer is
  decoded alone (raw Rust decoder, special tokens kept); texts with U+FFFD (partial UTF-8)
  are keyed by the raw token string, others by a normalised form (NFKC, NFD, strip accents,
  lowercase, whitespace runs -> one space, a lone space protected from the final strip);
  compressed ids are the keys' first-seen order.
- ``engram_multipliers``: per Engram layer id l, ``numpy.random.default_rng(10007 * l)``
  draws N int64 values below ``((2^63-1) // V_c) // 2``; multiplier = ``2 v + 1`` (odd, and
  ``V_c * mult < 2^63`` so every product and XOR stays a non-negative int64).
- ``engram_primes``: one shared ascending search: for each layer, for each n-gram size
  (2..N), for each head, the smallest unused prime above the previous one, restarting at
  ``engram_vocab_size - 1`` for each n-gram size.
- ``engram_offsets``: per layer, exclusive prefix sums of its primes in column order
  (column ``c = (n-2) * n_heads + h``), so column c owns table rows ``[off_c, off_c + prime_c)``.
"""
from __future__ import annotations

import functools
import logging
import os
from pathlib import Path

import numpy as np
import torch

logger = logging.getLogger(__name__)

_MR_BASES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)  # deterministic below 3.3e24


def is_prime(n: int) -> bool:
    """Deterministic Miller-Rabin for the sizes used here."""
    if n < 2:
        return False
    for p in _MR_BASES:
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d //= 2
        s += 1
    for a in _MR_BASES:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


@functools.lru_cache(maxsize=32)
def engram_primes(n_layers: int, max_ngram: int, n_heads: int, vocab_size: int) -> tuple[tuple[int, ...], ...]:
    """Per Engram layer (in ``engram_layer_ids`` order): its primes in column order, length (N-1)*n_heads."""
    seen: set[int] = set()
    out = []
    for _ in range(n_layers):
        cols: list[int] = []
        for _n in range(max_ngram - 1):
            cur = vocab_size - 1
            for _h in range(n_heads):
                cur += 1
                while cur in seen or not is_prime(cur):
                    cur += 1
                seen.add(cur)
                cols.append(cur)
        out.append(tuple(cols))
    return tuple(out)


def engram_offsets(primes: tuple[tuple[int, ...], ...]) -> list[list[int]]:
    """Exclusive prefix sums of each layer's primes (first table row of each column)."""
    out = []
    for cols in primes:
        acc, offs = 0, []
        for p in cols:
            offs.append(acc)
            acc += p
        out.append(offs)
    return out


def engram_multipliers(layer_ids: tuple[int, ...], max_ngram: int, compressed_vocab: int) -> list[list[int]]:
    """Odd hash multipliers ``[n_layers][N]`` (python ints, all < 2^63 / compressed_vocab)."""
    bound = max(1, (np.iinfo(np.int64).max // compressed_vocab) // 2)
    rows = []
    for layer in layer_ids:
        v = np.random.default_rng(10007 * layer).integers(0, bound, size=max_ngram, dtype=np.int64)
        rows.append([int(x) * 2 + 1 for x in v])
    return rows


def _normalizer():
    from tokenizers import Regex, normalizers

    lone_space = "\ue000"  # keeps a token that is exactly one space from being stripped to ""
    return normalizers.Sequence([
        normalizers.NFKC(), normalizers.NFD(), normalizers.StripAccents(), normalizers.Lowercase(),
        normalizers.Replace(Regex(r"[ \t\r\n]+"), " "), normalizers.Replace(Regex(r"^ $"), lone_space),
        normalizers.Strip(), normalizers.Replace(lone_space, " "),
    ])


def token_map_from_tokenizer(backend) -> tuple[list[int], int]:
    """``(token_map, compressed_vocab_size)`` for a ``tokenizers.Tokenizer``."""
    n = backend.get_vocab_size(with_added_tokens=True)
    texts = backend.decode_batch([[i] for i in range(n)], skip_special_tokens=False)
    norm = _normalizer()
    keys: dict[str, int] = {}
    out = []
    for i, text in enumerate(texts):
        if "\ufffd" in text:
            key = backend.id_to_token(i)
        else:
            key = norm.normalize_str(text) or text
        out.append(keys.setdefault(key, len(keys)))
    return out, len(keys)


@functools.lru_cache(maxsize=8)
def _token_map_cached(path: str, size: int, mtime_ns: int) -> tuple[tuple[int, ...], int]:
    import tokenizers

    backend = tokenizers.Tokenizer.from_file(path)
    m, n = token_map_from_tokenizer(backend)
    return tuple(m), n


def build_token_map(tokenizer_json: str | Path) -> tuple[list[int], int]:
    """Token map of a ``tokenizer.json`` file (cached per file version: it takes about a second)."""
    p = Path(tokenizer_json)
    if not p.is_file():
        raise FileNotFoundError(f"Engram needs the checkpoint tokenizer to build its token map; {p} does not exist")
    st = os.stat(p)
    m, n = _token_map_cached(str(p.resolve()), st.st_size, st.st_mtime_ns)
    return list(m), n


def token_map_tensor(token_map: list[int], vocab_size: int, pad_compressed: int) -> torch.Tensor:
    """int64 ``[vocab_size]``; ids the tokenizer does not have map to the pad's compressed id."""
    if len(token_map) < vocab_size:
        logger.warning("the tokenizer has %d ids for vocab_size %d; Engram hashes the extra ids as padding",
                       len(token_map), vocab_size)
        token_map = list(token_map) + [pad_compressed] * (vocab_size - len(token_map))
    return torch.tensor(token_map[:max(vocab_size, len(token_map))], dtype=torch.long)


__all__ = ["is_prime", "engram_primes", "engram_offsets", "engram_multipliers", "build_token_map",
           "token_map_from_tokenizer", "token_map_tensor"]
