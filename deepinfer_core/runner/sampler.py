"""The Sampler: logits of this step's sequences -> next token ids (+ logprobs).

One row of ``logits`` is one sequence being sampled this step. Per row, in
vLLM v1's order:

1. logprobs, when requested, come from the RAW logits (``log_softmax`` of the
   model output before min_tokens masking, penalties and temperature; vLLM's
   default ``raw_logprobs`` mode). Anything applied to the logits before the
   Sampler (e.g. a structured-output bitmask) is therefore included.
2. min_tokens: EOS ids and the row's ``stop_token_ids`` get -inf while the
   sequence has fewer than ``min_tokens`` output tokens.
3. penalties (``sample.apply_penalties``): repetition over prompt+output
   tokens, frequency/presence over output tokens.
4. greedy rows (temperature < 1e-5): argmax; ties go to the lowest token id.
5. other rows: divide by temperature, then ``sample.topk_topp_minp`` (min-p,
   top-k, top-p), then ``sample.exponential_race`` with Exp(1) noise.

Determinism. The noise of a row comes from that row's own ``torch.Generator``
when the request has a seed (``make_generator(seed, seq_index)``, owned by the
engine, one per sequence), else from one sampler-wide generator. Each random
sample of a row draws exactly V values from its generator, and every op above
works row by row, so a seeded row's token depends only on (seed, sequence
index, its own logits, how many tokens it has sampled before), never on the
other rows or its position in the batch. Greedy rows draw nothing.
"""
from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import torch

from deepinfer_core.runner.context import upload
from deepinfer_core.sampling_params import SamplingParams

SAMPLING_OPS = ("sample.apply_penalties", "sample.topk_topp_minp", "sample.exponential_race")

# The noise is always drawn in fp32 so a generator advances the same way
# whatever the logits dtype is.
_NOISE_DTYPE = torch.float32


# -- generators ---------------------------------------------------------------

def derive_seed(seed: int, seq_index: int = 0) -> int:
    """A 63-bit seed for sequence ``seq_index`` of a request seeded with ``seed``.

    A hash rather than ``seed + seq_index``, so that (seed=1, seq 1) and
    (seed=2, seq 0) get unrelated streams.
    """
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    if not isinstance(seq_index, int) or isinstance(seq_index, bool) or seq_index < 0:
        raise ValueError(f"seq_index must be a non-negative int, got {seq_index!r}")
    digest = hashlib.blake2b(f"deepinfer.sample:{seed}:{seq_index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def position_seed(seed: int, seq_index: int, position: int) -> int:
    """Seed of the draw for the token at ``position`` of sequence ``seq_index`` of a request.

    Keying the random stream by (seed, sequence, position) rather than by how many
    draws were made keeps a seeded request's tokens independent of batch slot,
    preemption/recompute and (later) rejected speculative tokens.
    """
    digest = hashlib.blake2b(f"deepinfer.sample:{seed}:{seq_index}:{position}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def make_generator(seed: int, seq_index: int = 0, device: torch.device | str | None = None) -> torch.Generator:
    """The generator of sequence ``seq_index`` (0..n-1) of a request with ``seed``.

    The engine creates it once per sequence on the logits' device and passes it
    in ``SamplingMetadata.generators`` every step; the Sampler advances it by
    one draw per randomly sampled token.
    """
    g = torch.Generator(device=torch.device(device) if device is not None else "cpu")
    g.manual_seed(derive_seed(seed, seq_index))
    return g


# -- inputs and outputs -------------------------------------------------------

@dataclass
class SamplingMetadata:
    """Per-row description of one sampling step (CPU objects; row i = logits[i]).

    params: each row's SamplingParams (rows of one request share the object).
    output_token_ids: tokens this sequence has generated so far (for
      penalties and min_tokens).
    prompt_token_ids: the request's prompt; required only when a row has
      ``repetition_penalty != 1``.
    generators: per-row generator or None (None: the sampler-wide generator).
      A row whose params have a seed MUST have one.
    eos_token_ids: the model's EOS ids, masked (with the row's stop_token_ids)
      while ``len(output) < min_tokens``.
    """

    params: Sequence[SamplingParams]
    output_token_ids: Sequence[Sequence[int]]
    prompt_token_ids: Sequence[Sequence[int]] | None = None
    generators: Sequence[torch.Generator | None] | None = None
    eos_token_ids: Sequence[int] = ()

    def __post_init__(self) -> None:
        b = len(self.params)
        if len(self.output_token_ids) != b:
            raise ValueError(f"output_token_ids has {len(self.output_token_ids)} rows, params has {b}")
        if self.prompt_token_ids is not None and len(self.prompt_token_ids) != b:
            raise ValueError(f"prompt_token_ids has {len(self.prompt_token_ids)} rows, params has {b}")
        if self.generators is None:
            self.generators = [None] * b
        elif len(self.generators) != b:
            raise ValueError(f"generators has {len(self.generators)} rows, params has {b}")
        for i, (p, g) in enumerate(zip(self.params, self.generators)):
            if not isinstance(p, SamplingParams):
                raise TypeError(f"params[{i}] must be a SamplingParams, got {type(p).__name__}")
            if p.seed is not None and g is None and not p.greedy:
                raise ValueError(
                    f"row {i} has seed={p.seed} but no generator; pass make_generator(seed, seq_index)"
                )
        self.eos_token_ids = tuple(self.eos_token_ids)

    @property
    def num_rows(self) -> int:
        return len(self.params)


@dataclass(frozen=True)
class TokenLogprobs:
    """Logprobs of one sampled token (Python values, for the output processor).

    ``top_token_ids``/``top_logprobs`` hold the row's requested top-k, most
    likely first; ``rank`` is the sampled token's 1-based rank (the number of
    tokens whose logprob is >= its own, as vLLM counts it).
    """

    token_id: int
    logprob: float
    rank: int
    top_token_ids: list[int]
    top_logprobs: list[float]


@dataclass
class LogprobsTensors:
    """Batched logprobs of a step (device tensors until asked for rows).

    token_ids int64 [B, 1+K] and logprobs fp32 [B, 1+K]: column 0 is the
    sampled token, columns 1.. the top-K (K = the largest request in the
    batch). ranks int64 [B]. num_logprobs[i]: row i's K, None if not requested.
    """

    token_ids: torch.Tensor
    logprobs: torch.Tensor
    ranks: torch.Tensor
    num_logprobs: list[int | None]

    def row(self, i: int) -> TokenLogprobs | None:
        k = self.num_logprobs[i]
        if k is None:
            return None
        ids = self.token_ids[i].tolist()
        lps = self.logprobs[i].tolist()
        return TokenLogprobs(ids[0], lps[0], int(self.ranks[i]), ids[1:1 + k], lps[1:1 + k])

    def rows(self) -> list[TokenLogprobs | None]:
        """Every row (``row(i)`` for each i), with one host transfer per tensor instead of one per row."""
        ids, lps, ranks = self.token_ids.tolist(), self.logprobs.tolist(), self.ranks.tolist()
        return [None if k is None else
                TokenLogprobs(ids[i][0], lps[i][0], int(ranks[i]), ids[i][1:1 + k], lps[i][1:1 + k])
                for i, k in enumerate(self.num_logprobs)]


@dataclass
class SamplerOutput:
    """token_ids int64 [B] on the logits' device; logprobs None if no row asked."""

    token_ids: torch.Tensor
    logprobs: LogprobsTensors | None = None

    def row_logprobs(self, i: int) -> TokenLogprobs | None:
        return None if self.logprobs is None else self.logprobs.row(i)


# -- logprob helpers (also used for prompt logprobs) ------------------------------

def compute_logprobs(logits: torch.Tensor) -> torch.Tensor:
    """fp32 ``log_softmax`` over the last dim. logits [T, V] -> [T, V]."""
    return torch.log_softmax(logits.float(), dim=-1)


def gather_logprobs(logprobs: torch.Tensor, token_ids: torch.Tensor, num_logprobs: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-``num_logprobs`` plus the given tokens' logprobs and ranks.

    logprobs fp32 [T, V]; token_ids int64 [T]. Returns (ids int64 [T, 1+k],
    logprobs fp32 [T, 1+k], ranks int64 [T]); column 0 is ``token_ids``.
    """
    if not 0 <= num_logprobs <= logprobs.shape[-1]:
        raise ValueError(f"num_logprobs must be in [0, {logprobs.shape[-1]}], got {num_logprobs}")
    token_ids = token_ids.long()[:, None]
    chosen = logprobs.gather(1, token_ids)
    top_lp, top_ids = torch.topk(logprobs, num_logprobs, dim=-1)
    ranks = (logprobs >= chosen).sum(dim=-1)
    return torch.cat([token_ids, top_ids], dim=1), torch.cat([chosen, top_lp], dim=1), ranks


# -- ops ------------------------------------------------------------------------

@dataclass(frozen=True)
class SamplingOps:
    """The resolved callables of the sampling ops and the provider of each."""

    apply_penalties: Callable[..., torch.Tensor]
    topk_topp_minp: Callable[..., torch.Tensor]
    exponential_race: Callable[..., torch.Tensor]
    providers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def reference(cls) -> "SamplingOps":
        """The pure-torch references, without a registry."""
        from deepinfer_core.kernels.ops import sampling as ref

        return cls(ref.apply_penalties, ref.topk_topp_minp, ref.exponential_race,
                   {name: "reference" for name in SAMPLING_OPS})

    @classmethod
    def from_registry(cls, registry: Any, preferred: Iterable[str] = (),
                      overrides: dict[str, str] | None = None) -> "SamplingOps":
        """Resolve the three ops once (``registry.resolve`` order rules apply)."""
        preferred = tuple(preferred)
        resolved = {name: registry.resolve(name, preferred, overrides) for name in SAMPLING_OPS}
        fns = [resolved[name][1] for name in SAMPLING_OPS]
        return cls(*fns, providers={name: resolved[name][0] for name in SAMPLING_OPS})


# -- the sampler ----------------------------------------------------------------

class Sampler:
    """Samples one token per logits row; see the module docstring for the order.

    ``ops``: resolved SamplingOps; None resolves them from the process-wide
    kernel registry (imported here, not at module import). ``seed``: seeds the
    sampler-wide generator used by unseeded rows (None: a random seed).
    """

    def __init__(self, ops: SamplingOps | None = None, seed: int | None = None) -> None:
        if ops is None:
            from deepinfer_core.kernels.registry import get_registry

            ops = SamplingOps.from_registry(get_registry())
        self.ops = ops
        self._seed = secrets.randbits(63) if seed is None else derive_seed(seed, 0)
        self._shared: dict[torch.device, torch.Generator] = {}

    def shared_generator(self, device: torch.device) -> torch.Generator:
        """The generator for unseeded rows on ``device`` (created on first use)."""
        device = torch.device(device)
        if device not in self._shared:
            g = torch.Generator(device=device)
            g.manual_seed(self._seed)
            self._shared[device] = g
        return self._shared[device]

    def __call__(self, logits: torch.Tensor, metadata: SamplingMetadata) -> SamplerOutput:
        """logits float [B, V] (fp32; fp64 kept as is, half types upcast)."""
        if logits.dim() != 2 or not logits.is_floating_point():
            raise ValueError(f"logits must be a float [B, V] tensor, got {logits.dtype} {tuple(logits.shape)}")
        b, v = logits.shape
        if b != metadata.num_rows:
            raise ValueError(f"logits has {b} rows but the metadata describes {metadata.num_rows}")
        device = logits.device
        x, logprobs = self.process(logits, metadata)
        params = metadata.params
        token_ids = torch.empty(b, dtype=torch.int64, device=device)
        greedy = [i for i, p in enumerate(params) if p.greedy]
        rand = [i for i, p in enumerate(params) if not p.greedy]
        if greedy:
            # torch.argmax returns the first maximal index: ties -> lowest id.
            gi = _on(greedy, torch.int64, device)
            token_ids[gi] = x[gi].argmax(dim=-1)
        if rand:
            ri = _on(rand, torch.int64, device)
            token_ids[ri] = self.draw(x[ri], [metadata.generators[i] for i in rand])

        if logprobs is not None:
            logprobs = self._gather(logprobs, token_ids, metadata)
        return SamplerOutput(token_ids, logprobs)

    def process(self, logits: torch.Tensor, metadata: SamplingMetadata) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Steps 1-3 and the scaling/filtering of step 5, without drawing.

        Returns (x [B, V] fp32 (fp64 kept): greedy rows penalised logits, random rows
        ``filter(penalised / temperature)`` so that ``softmax(x[i])`` is exactly the
        distribution a random row is drawn from; raw logprobs [B, V] or None).
        Speculative verification uses these same rows, so its accept test and the
        plain sampler see one distribution.
        """
        x = logits if logits.dtype == torch.float64 else logits.float()
        params = metadata.params
        logprobs = self._raw_logprobs(x, metadata)  # before anything touches x
        x = self._mask_min_tokens(x, metadata)
        if any(p.has_penalties for p in params):
            x = self._apply_penalties(x, metadata)
        rand = [i for i, p in enumerate(params) if not p.greedy]
        if rand:
            ri = _on(rand, torch.int64, x.device)
            x = x.clone() if x is logits else x
            x[ri] = self._scale_filter(x[ri], [params[i] for i in rand])
        return x, logprobs

    def draw(self, x: torch.Tensor, generators: Sequence[torch.Generator | None]) -> torch.Tensor:
        """x [R, V] processed rows (``process``) -> int64 [R], one Exp(1) draw of V values per row."""
        r, v = x.shape
        dev = x.device
        # One [V] draw per row from that row's own stream: a seeded row's noise
        # is independent of which rows share the batch and where it sits.
        q = torch.empty(r, v, dtype=_NOISE_DTYPE, device=dev)
        shared = None
        for j, g in enumerate(generators):
            if g is None:
                if shared is None:
                    shared = self.shared_generator(dev)
                g = shared
            q[j].exponential_(generator=g)
        return self.ops.exponential_race(x, q)

    # -- steps --------------------------------------------------------------
    @staticmethod
    def _raw_logprobs(x: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor | None:
        if all(p.logprobs is None for p in metadata.params):
            return None
        return compute_logprobs(x)

    @staticmethod
    def _gather(raw: torch.Tensor, token_ids: torch.Tensor, metadata: SamplingMetadata) -> LogprobsTensors:
        v = raw.shape[-1]
        per_row = [None if p.logprobs is None else (v if p.logprobs == -1 else min(p.logprobs, v))
                   for p in metadata.params]
        k = max(n for n in per_row if n is not None)
        ids, lps, ranks = gather_logprobs(raw, token_ids, k)
        return LogprobsTensors(ids, lps, ranks, per_row)

    @staticmethod
    def _mask_min_tokens(x: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
        v = x.shape[-1]
        rows: list[int] = []
        cols: list[int] = []
        for i, (p, out) in enumerate(zip(metadata.params, metadata.output_token_ids)):
            if len(out) >= p.min_tokens:
                continue
            for t in dict.fromkeys((*metadata.eos_token_ids, *p.stop_token_ids)):
                if not 0 <= t < v:
                    raise ValueError(f"row {i}: stop/EOS token id {t} is outside the vocabulary of size {v}")
                rows.append(i)
                cols.append(t)
        if not rows:
            return x
        x = x.clone()
        x[_on(rows, torch.int64, x.device), _on(cols, torch.int64, x.device)] = float("-inf")
        return x

    def _apply_penalties(self, x: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
        b, v = x.shape
        params = metadata.params
        # Rows without penalties contribute padding only: their history is not needed.
        needs_prompt = [p.repetition_penalty != 1.0 for p in params]
        if any(needs_prompt) and metadata.prompt_token_ids is None:
            raise ValueError("prompt_token_ids are required when a row has repetition_penalty != 1")
        prompts = [metadata.prompt_token_ids[i] if needs_prompt[i] else () for i in range(b)]
        outputs = [metadata.output_token_ids[i] if p.has_penalties else () for i, p in enumerate(params)]
        dev = x.device
        rep = _on([p.repetition_penalty for p in params], x.dtype, dev)
        freq = _on([p.frequency_penalty for p in params], x.dtype, dev)
        pres = _on([p.presence_penalty for p in params], x.dtype, dev)
        return self.ops.apply_penalties(x, _pad(prompts, v, dev), _pad(outputs, v, dev), rep, freq, pres)

    def _scale_filter(self, x: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
        """x [R, V] penalised logits of the random rows -> ``topk_topp_minp(x / temperature)``."""
        dev = x.device
        temp = _on([p.temperature for p in params], x.dtype, dev)
        x = x / temp[:, None]
        if any(p.top_k > 0 or p.top_p < 1.0 or p.min_p > 0.0 for p in params):
            top_k = _on([max(p.top_k, 0) for p in params], torch.int64, dev)
            top_p = _on([p.top_p for p in params], x.dtype, dev)
            min_p = _on([p.min_p for p in params], x.dtype, dev)
            x = self.ops.topk_topp_minp(x, top_k, top_p, min_p)
        return x


def _pad(rows: Sequence[Sequence[int]], vocab_size: int, device: torch.device) -> torch.Tensor:
    """Ragged token-id rows -> int64 [B, max_len] padded with ``vocab_size``."""
    width = max((len(r) for r in rows), default=0)
    out = torch.full((len(rows), width), vocab_size, dtype=torch.int64)
    for i, r in enumerate(rows):
        if len(r):
            ids = torch.as_tensor(list(r), dtype=torch.int64)
            if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
                raise ValueError(f"row {i}: token ids must be in [0, {vocab_size}), got min {int(ids.min())} "
                                 f"max {int(ids.max())}")
            out[i, :len(r)] = ids
    return upload(out, device)


def _on(values: Sequence[Any], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A short host list as a tensor on ``device`` without making the host wait for the device: staged
    through pinned memory and copied asynchronously (``runner/context.upload``). ``torch.tensor(values,
    device=...)`` would synchronise the stream, and a step launched behind one still running on the device
    (the engine's chained decode steps) must not wait for it."""
    return upload(torch.tensor(values, dtype=dtype), device)
