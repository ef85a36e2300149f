"""A tiny DeepSeek-V4.1 checkpoint whose DSpark draft head agrees with its target model.

The random checkpoints of ``checkpoint_writer`` have a draft that almost never proposes the
target's token, so speculative decoding never accepts anything. This writer starts from the
same tensors (``make_tensors`` of a ``tiny_v41_config``, unquantised, real native layout,
config.json and tokenizer files) and overrides a handful of them so that both models follow a
small synthetic language:

- **Language.** ``S`` = ``num_tokens`` ordinary token ids (seeded choice in [1000, 100000),
  no special tokens) in a seeded cyclic order ``s_0 .. s_{m-1}``. The target rule is the
  cyclic successor ``target_next(s_i) = s_{i+1}``; the draft rule agrees on the *agree set*
  ``A`` (a seeded subset of ``round(agree_fraction * m)`` tokens) and skips one token elsewhere:
  ``draft_next(s_i) = s_{i+2}`` for ``s_i`` not in ``A``.
- **Target.** The embedding rows of ``S`` are ``sqrt(D)`` times orthonormal vectors ``q_i``
  (a seeded orthogonal matrix, D = hidden_size). Every layer's residual-stream writers (the
  attention ``wo_b``, the expert and shared-expert ``w2``, the Engram ``wkv`` whose value is
  injected) are scaled by ``OUT_SCALE`` = 1e-3, so the final hidden state is the current
  token's embedding up to ~1e-3 (mHC only mixes and rescales the n copies of it; the final RMS
  norm removes the scale). The head rows of ``S`` are set to ``head[target_next(s_i)] =
  HEAD_GAIN * q_i``, giving the right token a logit ~ ``HEAD_GAIN * sqrt(D)`` = 32 against
  ~N(0, 1) for the 129k untouched random rows: greedy decoding follows ``target_next`` at every
  position, whatever the context length (sliding window, compressed and sparse attention only
  add ~1e-3 perturbations).
- **Draft.** The last stage's final norm ``mtp.{n_mtp_layers-1}.norm.weight`` is set to
  ``DRAFT_NORM`` = 1e-3, so the base logits ``U = head(norm(h))`` are ~1e-2 and negligible.
  The Markov head (rank ``r = dspark_markov_rank`` >= m + 1, default m + 1) implements the draft
  rule: ``markov_head.embed[s_i]`` = one-hot of ``i`` plus a spare coordinate ``r-1`` = +1 if
  ``s_i`` in A else -1; ``markov_head.head[draft_next(s_i), i] = MARKOV_GAIN`` (other rows of S
  zero). So draft k = ``draft_next(prev_k)`` exactly, prev_0 = the anchor.
- **Confidence.** ``confidence_head.proj [1, D + r]`` is zero except ``CONF_GAIN`` on the spare
  Markov coordinate: ``conf_k = sigmoid(+-CONF_GAIN)`` ~ 1 iff ``prev_k`` in A, i.e. iff draft k
  equals the target's token given that its predecessor was right. Draft k is the first rejected
  one exactly when ``prev_k`` is the first token of the chain outside A.

Why acceptance is high: from anchor ``a`` the drafts are ``draft_next^k(a)`` and the target's
greedy continuation is ``target_next^k(a)``; they agree for as long as the chain
``a, s_{+1}, s_{+2}, ..`` stays in A, so the accepted length is ``min(N, run of A tokens
starting at a)``. With 28 of 32 tokens in A, averaged over every anchor of the cycle, that is at
least 3.125 of N = 5 whatever A is (the per-run sum is convex in the run length, so evenly spread
disagreeing tokens are the worst case); ``SyntheticLanguage.mean_accepted`` computes it exactly.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path

import torch

from deepinfer_models.deepseek_v4.checkpoint_writer import write_checkpoint
from deepinfer_models.deepseek_v41.checkpoint_writer import QUANT_PRESETS, make_tensors, tiny_v41_config

OUT_SCALE = 1e-3  # residual-stream writers of every target layer
HEAD_GAIN = 4.0  # target head row norm for next(t): logit ~ HEAD_GAIN * sqrt(D)
DRAFT_NORM = 1e-3  # draft final-norm weight: base logits become negligible
MARKOV_GAIN = 20.0  # Markov logit of draft_next(prev)
CONF_GAIN = 10.0  # confidence logit: sigmoid(+-10) = 0.99995 / 4.5e-5
TOKEN_RANGE = (1000, 100000)  # ordinary tokens of the DeepSeek vocabulary
# leaf names of the tensors that write into the residual stream (scaled by OUT_SCALE)
_WRITERS = ("attn.wo_b.weight", "shared_experts.w2.weight", "engram.wkv.weight")


@dataclass(frozen=True)
class SyntheticLanguage:
    """The language the agreeing checkpoint speaks.

    ``tokens``: S, token ids in cycle order (``target_next(tokens[i]) = tokens[i+1 mod m]``);
    ``agree``: A, the tokens on which ``draft_next == target_next``. Token ids are Python ints.
    """

    tokens: tuple[int, ...]
    agree: frozenset[int]

    @functools.cached_property
    def index(self) -> dict[int, int]:
        """token id -> position in the cycle."""
        return {t: i for i, t in enumerate(self.tokens)}

    def target_next(self, t: int) -> int:
        """The target model's greedy next token after ``t`` (cyclic successor in S)."""
        return self.tokens[(self.index[t] + 1) % len(self.tokens)]

    def draft_next(self, t: int) -> int:
        """The draft's (Markov head's) token after ``t``: the target's for t in A, else skips one."""
        step = 1 if t in self.agree else 2
        return self.tokens[(self.index[t] + step) % len(self.tokens)]

    def prompt(self, length: int, start_token: int | None = None) -> list[int]:
        """``length`` tokens from ``start_token`` (default ``tokens[0]``), each the ``target_next``
        of the previous one."""
        t = self.tokens[0] if start_token is None else int(start_token)
        if t not in self.index:
            raise ValueError(f"start token {t} is not in the language")
        out = []
        for _ in range(length):
            out.append(t)
            t = self.target_next(t)
        return out

    def accepted_length(self, anchor: int, n: int) -> int:
        """Greedy drafts accepted from ``anchor`` among ``n``: the run of A tokens starting at it."""
        k, t = 0, anchor
        while k < n and t in self.agree:
            k, t = k + 1, self.target_next(t)
        return k

    def mean_accepted(self, n: int) -> float:
        """``accepted_length`` averaged over every anchor in S."""
        return sum(self.accepted_length(t, n) for t in self.tokens) / len(self.tokens)


def make_language(num_tokens: int = 32, agree_fraction: float = 0.875, seed: int = 0) -> SyntheticLanguage:
    """A seeded ``SyntheticLanguage`` of ``num_tokens`` tokens, ``round(agree_fraction * m)`` agreeing."""
    if num_tokens < 3:
        raise ValueError(f"num_tokens must be >= 3 (the disagreeing draft rule skips a token), got {num_tokens}")
    if not 0.0 <= agree_fraction <= 1.0:
        raise ValueError(f"agree_fraction must be in [0, 1], got {agree_fraction}")
    g = torch.Generator().manual_seed(seed)
    lo, hi = TOKEN_RANGE
    tokens = (torch.randperm(hi - lo, generator=g)[:num_tokens] + lo).tolist()
    n_agree = round(agree_fraction * num_tokens)
    agree = frozenset(tokens[i] for i in torch.randperm(num_tokens, generator=g)[:n_agree].tolist())
    return SyntheticLanguage(tuple(tokens), agree)


def agreeing_tensors(cfg, lang: SyntheticLanguage, seed: int = 0) -> dict[str, torch.Tensor]:
    """``make_tensors(cfg, seed)`` (unquantised ``cfg``) with the overrides described above.

    Shapes (D = hidden_size, V = vocab_size, r = dspark_markov_rank): ``embed.weight`` /
    ``head.weight`` [V, D], ``markov_head.embed.weight`` / ``.head.weight`` [V, r],
    ``confidence_head.proj.weight`` [1, D + r]; each keeps the dtype ``make_tensors`` gave it
    (bf16 weights, fp32 where the layout says so)."""
    m, D, r = len(lang.tokens), cfg.hidden_size, cfg.dspark_markov_rank
    if m > D:
        raise ValueError(f"{m} language tokens need hidden_size >= {m} (orthogonal embeddings), got {D}")
    if r < m + 1:
        raise ValueError(f"dspark_markov_rank must be >= num_tokens + 1 = {m + 1} (one-hot + A flag), got {r}")
    t = make_tensors(cfg, seed)
    idx = lang.index
    ids = torch.tensor(lang.tokens)
    g = torch.Generator().manual_seed(seed + 7)
    q = torch.linalg.qr(torch.randn(D, D, generator=g, dtype=torch.float64))[0].T[:m].float()  # [m, D] orthonormal

    def put(name: str, fill) -> None:
        v = t[name].float()
        fill(v)
        t[name] = v.to(t[name].dtype).contiguous()

    def target(v):
        v[ids] = q * D ** 0.5

    def head(v):
        v[ids] = 0.0
        for s in lang.tokens:
            v[lang.target_next(s)] = HEAD_GAIN * q[idx[s]]

    put("embed.weight", target)
    put("head.weight", head)
    for name in list(t):
        if name.startswith("layers.") and (name.endswith(_WRITERS) or
                                           (".ffn.experts." in name and name.endswith(".w2.weight"))):
            put(name, lambda v: v.mul_(OUT_SCALE))

    last = cfg.n_mtp_layers - 1
    put(f"mtp.{last}.norm.weight", lambda v: v.fill_(DRAFT_NORM))

    def markov_embed(v):
        v[ids] = 0.0
        v[ids, torch.arange(m)] = 1.0
        v[ids, r - 1] = torch.tensor([1.0 if s in lang.agree else -1.0 for s in lang.tokens])

    def markov_head(v):
        v[ids] = 0.0
        for s in lang.tokens:
            v[lang.draft_next(s), idx[s]] = MARKOV_GAIN

    def confidence(v):
        v.zero_()
        v[0, D + r - 1] = CONF_GAIN

    put(f"mtp.{last}.markov_head.embed.weight", markov_embed)
    put(f"mtp.{last}.markov_head.head.weight", markov_head)
    put(f"mtp.{last}.confidence_head.proj.weight", confidence)
    return t


def write_agreeing_v41_checkpoint(out_dir: str | Path, agree_fraction: float = 0.875, seed: int = 0,
                                  num_tokens: int = 32, topology: str = "flash",
                                  **config_overrides) -> SyntheticLanguage:
    """Write the agreeing tiny V4.1 checkpoint (unquantised, native layout) to ``out_dir``.

    ``agree_fraction``: share of S in A; ``seed``: base weights (as ``make_tensors``), token set
    and A; ``num_tokens``: m = |S| (<= hidden_size); ``topology`` / ``config_overrides``: passed to
    ``tiny_v41_config`` (``dspark_markov_rank`` defaults to m + 1). Returns the language; the
    checkpoint loads with ``load_deepseek_v41`` and ``load_dspark_weights``.
    """
    lang = make_language(num_tokens, agree_fraction, seed)
    config_overrides.setdefault("dspark_markov_rank", num_tokens + 1)
    cfg = dataclasses.replace(tiny_v41_config(topology, **config_overrides), quant=QUANT_PRESETS["none"])
    cfg.validate()  # before the tensors are made
    write_checkpoint(out_dir, cfg, agreeing_tensors(cfg, lang, seed))
    return lang


__all__ = ["SyntheticLanguage", "make_language", "agreeing_tensors", "write_agreeing_v41_checkpoint", "OUT_SCALE",
           "HEAD_GAIN", "DRAFT_NORM", "MARKOV_GAIN", "CONF_GAIN"]
