"""Sampler and sampling ops: hand-computed filters, penalties, logprobs,
min_tokens, greedy ties, seeded batch-invariant determinism, and the sampled
distribution itself (chi-square)."""
from __future__ import annotations

import math

import pytest
import torch

from deepinfer_core.kernels.ops import sampling as ops
from deepinfer_core.kernels.registry import KernelRegistry
from deepinfer_core.runner.sampler import (
    Sampler,
    SamplingMetadata,
    SamplingOps,
    derive_seed,
    gather_logprobs,
    make_generator,
)
from deepinfer_core.sampling_params import SamplingParams

NEG_INF = float("-inf")


def _registry_ops() -> SamplingOps:
    reg = KernelRegistry()
    for spec in ops.OPS:
        reg.register_op(spec)
    return SamplingOps.from_registry(reg)


def _sampler(seed: int = 0) -> Sampler:
    return Sampler(ops=_registry_ops(), seed=seed)


def _logits_from_probs(*probs: float) -> torch.Tensor:
    return torch.tensor(probs, dtype=torch.float64).log()[None, :]


def _kept(masked: torch.Tensor) -> list[int]:
    return torch.nonzero(~torch.isneginf(masked[0])).flatten().tolist()


def _filter(logits, k=0, p=1.0, min_p=0.0):
    b = logits.shape[0]
    return ops.topk_topp_minp(logits, torch.full((b,), k), torch.full((b,), p, dtype=torch.float64),
                              torch.full((b,), min_p, dtype=torch.float64))


def _meta(params, outputs=None, prompts=None, generators=None, eos=()):
    outputs = outputs if outputs is not None else [[] for _ in params]
    return SamplingMetadata(params, outputs, prompts, generators, eos)


# -- ops: hand-computed filters ----------------------------------------------------

def test_registry_resolves_references():
    resolved = _registry_ops()
    assert resolved.providers == {name: "reference" for name in
                                  ("sample.apply_penalties", "sample.topk_topp_minp", "sample.exponential_race")}
    assert resolved.topk_topp_minp is ops.topk_topp_minp


def test_top_k_keeps_k_largest_and_ties_with_kth():
    x = torch.tensor([[1.0, 3.0, 2.0, 5.0, 4.0]], dtype=torch.float64)
    assert _kept(_filter(x, k=2)) == [3, 4]
    assert _kept(_filter(x, k=1)) == [3]
    assert _kept(_filter(x, k=0)) == [0, 1, 2, 3, 4]
    assert _kept(_filter(x, k=5)) == [0, 1, 2, 3, 4]
    ties = torch.tensor([[1.0, 3.0, 3.0, 0.0]], dtype=torch.float64)
    assert _kept(_filter(ties, k=1)) == [1, 2]  # tokens tied with the k-th all survive
    # Surviving logits are untouched.
    out = _filter(x, k=2)
    assert out[0, 3] == 5.0 and out[0, 4] == 4.0


def test_top_p_includes_first_token_crossing_p():
    x = _logits_from_probs(0.5, 0.3, 0.15, 0.05)
    assert _kept(_filter(x, p=0.5 - 1e-9)) == [0]  # 0.5 alone reaches p
    assert _kept(_filter(x, p=0.5 + 1e-9)) == [0, 1]  # token 1 crosses p: included
    assert _kept(_filter(x, p=0.6)) == [0, 1]
    assert _kept(_filter(x, p=0.8 + 1e-9)) == [0, 1, 2]
    assert _kept(_filter(x, p=0.95 + 1e-9)) == [0, 1, 2, 3]
    assert _kept(_filter(x, p=1e-6)) == [0]  # at least one token survives
    # Order in the vocabulary does not matter, only the probabilities.
    y = _logits_from_probs(0.05, 0.15, 0.5, 0.3)
    assert _kept(_filter(y, p=0.6)) == [2, 3]


def test_top_p_one_keeps_even_negligible_tokens():
    # Rounding in the running sum must not drop the tail when top_p == 1.
    x = torch.cat([torch.full((1, 1), 30.0), torch.randn(1, 999) - 30.0], dim=1).float()
    assert (~torch.isneginf(ops.topk_topp_minp(x, torch.zeros(1, dtype=torch.int64), torch.ones(1),
                                               torch.zeros(1)))).all()


def test_top_p_applies_to_top_k_renormalised_probs():
    x = _logits_from_probs(0.4, 0.3, 0.2, 0.1)
    assert _kept(_filter(x, p=0.5)) == [0, 1]  # full distribution: 0.4 < 0.5 before token 1
    assert _kept(_filter(x, k=2, p=0.5)) == [0]  # after top-k: 4/7 >= 0.5 before token 1
    assert _kept(_filter(x, k=2, p=0.6)) == [0, 1]


def test_min_p_relative_to_max_and_applied_before_top_p():
    x = _logits_from_probs(0.5, 0.3, 0.15, 0.05)
    assert _kept(_filter(x, min_p=0.35)) == [0, 1]  # threshold 0.175
    assert _kept(_filter(x, min_p=0.11)) == [0, 1, 2]  # threshold 0.055
    assert _kept(_filter(x, min_p=1.0)) == [0]
    # vLLM order: min-p first, then top-p on the renormalised survivors
    # (0.625, 0.375): 0.625 >= 0.6 already, so only token 0 is left.
    assert _kept(_filter(x, p=0.6)) == [0, 1]
    assert _kept(_filter(x, p=0.6, min_p=0.35)) == [0]


def test_filters_are_per_row_and_disabled_rows_untouched():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 40, generator=g, dtype=torch.float64)
    k = torch.tensor([0, 3, 0, 7, 40])
    p = torch.tensor([1.0, 1.0, 0.5, 0.9, 0.3], dtype=torch.float64)
    m = torch.tensor([0.0, 0.0, 0.0, 0.1, 0.05], dtype=torch.float64)
    batched = ops.topk_topp_minp(x, k, p, m)
    assert torch.equal(batched[0], x[0])
    for i in range(5):
        alone = ops.topk_topp_minp(x[i:i + 1], k[i:i + 1], p[i:i + 1], m[i:i + 1])
        assert torch.equal(alone[0], batched[i])


def _textbook_filter(row: list[float], k: int, p: float, min_p: float) -> set[int]:
    """Independent loop implementation of min-p -> top-k -> top-p."""
    v = len(row)
    mx = max(row)
    z = sum(math.exp(a - mx) for a in row)
    probs = [math.exp(a - mx) / z for a in row]
    alive = {i for i in range(v) if probs[i] >= min_p * max(probs)}
    if 0 < k < v:
        kth = sorted((row[i] for i in alive), reverse=True)[min(k, len(alive)) - 1]
        alive = {i for i in alive if row[i] >= kth}
    if p < 1:
        order = sorted(alive, key=lambda i: (-row[i], i))
        zz = sum(math.exp(row[i] - mx) for i in alive)
        mass, keep = 0.0, set()
        for i in order:
            if mass < p or not keep:
                keep.add(i)
            mass += math.exp(row[i] - mx) / zz
        alive = keep
    return alive


def test_filter_matches_textbook_loop_on_random_rows():
    g = torch.Generator().manual_seed(3)
    for trial in range(60):
        v = int(torch.randint(2, 30, (1,), generator=g))
        x = torch.randn(1, v, generator=g, dtype=torch.float64) * 2
        k = int(torch.randint(0, v + 1, (1,), generator=g))
        p = float(torch.rand(1, generator=g)) if trial % 3 else 1.0
        m = float(torch.rand(1, generator=g)) * 0.3 if trial % 2 else 0.0
        got = set(_kept(_filter(x, k=k, p=max(p, 1e-3), min_p=m)))
        assert got == _textbook_filter(x[0].tolist(), k, max(p, 1e-3), m), (trial, v, k, p, m)


# -- ops: penalties -------------------------------------------------------------------

def test_penalties_hand_computed():
    v = 6
    x = torch.tensor([[2.0, -1.0, 0.5, 3.0, -2.0, 1.0]], dtype=torch.float64)
    prompt = torch.tensor([[0, 1, v]])  # padded with V
    output = torch.tensor([[3, 3, 4, v, v]])
    out = ops.apply_penalties(x, prompt, output, torch.tensor([2.0], dtype=torch.float64),
                              torch.tensor([0.5], dtype=torch.float64), torch.tensor([0.25], dtype=torch.float64))
    expected = [
        2.0 / 2,  # prompt token, positive: divided; no frequency/presence (prompt only)
        -1.0 * 2,  # prompt token, negative: multiplied
        0.5,  # unseen
        3.0 / 2 - 0.5 * 2 - 0.25,  # output twice
        -2.0 * 2 - 0.5 * 1 - 0.25,  # output once
        1.0,  # unseen
    ]
    assert out.tolist()[0] == pytest.approx(expected, abs=1e-12)
    assert x[0, 0] == 2.0  # input not modified


def test_penalties_neutral_row_and_shapes():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 10, generator=g, dtype=torch.float64)
    ids = torch.tensor([[1, 2, 10], [3, 10, 10]])
    out = ops.apply_penalties(x, ids, ids, torch.tensor([1.0, 1.3], dtype=torch.float64),
                              torch.tensor([0.0, 0.0], dtype=torch.float64), torch.zeros(2, dtype=torch.float64))
    assert torch.equal(out[0], x[0])
    assert not torch.equal(out[1], x[1])
    with pytest.raises(ValueError, match=r"output_token_ids must have shape \[2, L\]"):
        ops.apply_penalties(x, ids, ids[:1], torch.ones(2), torch.zeros(2), torch.zeros(2))
    with pytest.raises(ValueError, match=r"repetition_penalties must have shape \[2\]"):
        ops.apply_penalties(x, ids, ids, torch.ones(3), torch.zeros(2), torch.zeros(2))


def test_exponential_race_is_argmax_of_probs_over_noise():
    x = torch.tensor([[0.0, 1.0, NEG_INF, 0.5]])
    assert ops.exponential_race(x, torch.ones(1, 4)).tolist() == [1]
    # Tiny noise on token 3 makes it win; zero noise on an excluded token cannot.
    assert ops.exponential_race(x, torch.tensor([[1.0, 1.0, 1.0, 1e-6]])).tolist() == [3]
    assert ops.exponential_race(x, torch.tensor([[1.0, 1.0, 0.0, 1.0]])).tolist() == [1]
    with pytest.raises(ValueError, match="q must have the logits' shape"):
        ops.exponential_race(x, torch.ones(1, 3))


def test_op_input_generators_and_compares():
    for spec in ops.OPS:
        n = 0
        for args, kwargs in spec.input_gen(torch.float32, "cpu", 0):
            out = spec.reference(*args, **kwargs)
            if spec.compare is not None:
                spec.compare(out, spec.reference(*args, **kwargs), torch.float32)
            n += 1
        assert n >= 3, spec.name
    # The compares reject real differences.
    masked = ops.OPS_BY_NAME["sample.topk_topp_minp"]
    a = torch.tensor([[0.0, NEG_INF]])
    with pytest.raises(AssertionError, match="masks differ"):
        masked.compare(a, torch.tensor([[0.0, 1.0]]), torch.float32)
    with pytest.raises(AssertionError):
        masked.compare(a, torch.tensor([[0.5, NEG_INF]]), torch.float32)
    with pytest.raises(AssertionError, match="sampled ids differ"):
        ops.OPS_BY_NAME["sample.exponential_race"].compare(torch.tensor([1]), torch.tensor([2]), torch.float32)


# -- sampler: greedy, penalties, min_tokens, logprobs ----------------------------------

def test_greedy_ties_go_to_lowest_id_and_ignore_filters():
    x = torch.tensor([[1.0, 5.0, 5.0, 2.0], [7.0, 7.0, 7.0, 7.0]])
    params = [SamplingParams(temperature=0.0, top_k=1, top_p=0.1), SamplingParams(temperature=0.0)]
    out = _sampler()(x, _meta(params))
    assert out.token_ids.tolist() == [1, 0]
    assert out.token_ids.dtype == torch.int64 and out.logprobs is None


def test_repetition_penalty_uses_prompt_tokens():
    x = torch.tensor([[3.0, 2.9, -1.0]])
    plain = SamplingParams(temperature=0.0)
    rep = SamplingParams(temperature=0.0, repetition_penalty=1.2)
    s = _sampler()
    assert s(x, _meta([plain], prompts=[[0]])).token_ids.tolist() == [0]
    assert s(x, _meta([rep], prompts=[[0]])).token_ids.tolist() == [1]  # 3.0 / 1.2 = 2.5 < 2.9
    with pytest.raises(ValueError, match="prompt_token_ids are required"):
        s(x, _meta([rep]))


def test_frequency_and_presence_use_output_tokens_only():
    x = torch.tensor([[3.0, 2.5, 0.0]])
    freq = SamplingParams(temperature=0.0, frequency_penalty=0.3)
    pres = SamplingParams(temperature=0.0, presence_penalty=0.6)
    s = _sampler()
    # Token 0 in the prompt only: no effect.
    got = s(torch.cat([x, x]), _meta([freq, pres], outputs=[[], []], prompts=[[0, 0, 0], [0]]))
    assert got.token_ids.tolist() == [0, 0]
    # Token 0 generated twice: 3.0 - 2 * 0.3 = 2.4 < 2.5; presence: 3.0 - 0.6 = 2.4.
    got = s(torch.cat([x, x]), _meta([freq, pres], outputs=[[0, 0], [0]], prompts=[[], []]))
    assert got.token_ids.tolist() == [1, 1]
    # One occurrence is not enough for the frequency penalty: 3.0 - 0.3 = 2.7.
    assert s(x, _meta([freq], outputs=[[0]], prompts=[[]])).token_ids.tolist() == [0]


def test_min_tokens_masks_eos_and_stop_ids():
    eos = 3
    x = torch.tensor([[0.0, 1.0, 4.0, 5.0]])  # EOS (3) is the argmax, stop id 2 next
    p = SamplingParams(temperature=0.0, min_tokens=2, stop_token_ids=[2])
    s = _sampler()
    assert s(x, _meta([p], outputs=[[]], eos=[eos])).token_ids.tolist() == [1]
    assert s(x, _meta([p], outputs=[[1]], eos=[eos])).token_ids.tolist() == [1]
    assert s(x, _meta([p], outputs=[[1, 1]], eos=[eos])).token_ids.tolist() == [3]
    # Random rows: EOS is never drawn while masked, even when it dominates.
    many = x.expand(500, 4).contiguous()
    rp = SamplingParams(temperature=1.0, min_tokens=1)
    got = s(many, _meta([rp] * 500, eos=[eos])).token_ids
    assert (got != eos).all() and (got == 2).any()
    with pytest.raises(ValueError, match="outside the vocabulary of size 4"):
        s(x, _meta([p], eos=[9]))


def test_logprobs_are_raw_log_softmax():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 12, generator=g)
    params = [
        SamplingParams(temperature=0.5, logprobs=3, frequency_penalty=1.0, top_k=2),
        SamplingParams(temperature=0.0, repetition_penalty=1.5),  # no logprobs
        SamplingParams(temperature=0.0, logprobs=0, presence_penalty=2.0),
    ]
    out = _sampler()(x, _meta(params, outputs=[[1, 1], [2], [int(x[2].argmax())]], prompts=[[0], [3], [4]]))
    ref = torch.log_softmax(x.double(), dim=-1)
    r0 = out.row_logprobs(0)
    t0 = int(out.token_ids[0])
    assert r0.token_id == t0 and r0.logprob == pytest.approx(float(ref[0, t0]), abs=1e-5)
    top = torch.topk(ref[0], 3)
    assert r0.top_token_ids == top.indices.tolist()
    assert r0.top_logprobs == pytest.approx(top.values.tolist(), abs=1e-5)
    assert r0.rank == int((ref[0] >= ref[0, t0]).sum())
    assert out.row_logprobs(1) is None
    r2 = out.row_logprobs(2)
    # The presence penalty moved greedy off the raw argmax; the logprob is still raw.
    t2 = int(out.token_ids[2])
    assert t2 != int(x[2].argmax()) and r2.rank == 2
    assert r2.logprob == pytest.approx(float(ref[2, t2]), abs=1e-5) and r2.top_token_ids == []
    assert out.logprobs.token_ids.shape == (3, 4) and out.logprobs.num_logprobs == [3, None, 0]


def test_logprobs_whole_vocab_and_gather_helper():
    x = torch.tensor([[0.0, 2.0, 1.0]])
    out = _sampler()(x, _meta([SamplingParams(temperature=0.0, logprobs=-1)]))
    row = out.row_logprobs(0)
    assert row.token_id == 1 and row.rank == 1 and row.top_token_ids == [1, 2, 0]
    assert sum(math.exp(v) for v in row.top_logprobs) == pytest.approx(1.0, abs=1e-6)
    ids, lps, ranks = gather_logprobs(torch.log_softmax(x, -1), torch.tensor([0]), 1)
    assert ids.tolist() == [[0, 1]] and ranks.tolist() == [3]
    with pytest.raises(ValueError, match="num_logprobs must be in"):
        gather_logprobs(torch.log_softmax(x, -1), torch.tensor([0]), 4)


def test_metadata_validation():
    p = SamplingParams(seed=3)
    with pytest.raises(ValueError, match="row 0 has seed=3 but no generator"):
        _meta([p])
    _meta([SamplingParams(seed=3, temperature=0.0)])  # greedy needs no generator
    with pytest.raises(ValueError, match="output_token_ids has 1 rows, params has 2"):
        SamplingMetadata([SamplingParams()] * 2, [[]])
    with pytest.raises(ValueError, match="logits has 2 rows but the metadata describes 1"):
        _sampler()(torch.zeros(2, 4), _meta([SamplingParams()]))
    with pytest.raises(TypeError, match=r"params\[0\] must be a SamplingParams"):
        _meta([dict(temperature=1.0)])


# -- sampler: seeded determinism -----------------------------------------------------

V = 512


def _row_logits(seed: int) -> torch.Tensor:
    return torch.randn(V, generator=torch.Generator().manual_seed(seed)) * 0.5  # fairly flat


def _run_request(seed: int, steps: int, *, position: int, others: int, seq_index: int = 0,
                 sampler_seed: int = 0, params: SamplingParams | None = None) -> list[int]:
    """Sample ``steps`` tokens for one seeded sequence placed at ``position``
    among ``others`` unrelated rows (mixed seeded/unseeded/greedy)."""
    params = params or SamplingParams(temperature=0.9, top_p=0.95, top_k=200, seed=seed)
    sampler = _sampler(sampler_seed)
    gen = make_generator(seed, seq_index)
    other_params = [SamplingParams(temperature=1.3, seed=1000 + j) if j % 3 == 0 else
                    SamplingParams(temperature=0.0) if j % 3 == 1 else SamplingParams(min_p=0.05)
                    for j in range(others)]
    other_gens = [make_generator(1000 + j, 0) if j % 3 == 0 else None for j in range(others)]
    tokens: list[int] = []
    for step in range(steps):
        rows = [_row_logits(step + 100 * (j + 1)) for j in range(others)]
        rows.insert(position, _row_logits(step))  # the request's own logits at this step
        plist = list(other_params)
        plist.insert(position, params)
        glist = list(other_gens)
        glist.insert(position, gen)
        out = sampler(torch.stack(rows), _meta(plist, outputs=[[] for _ in plist], generators=glist))
        tokens.append(int(out.token_ids[position]))
    return tokens


def test_seeded_reproducible_across_runs_and_batch_positions():
    alone = _run_request(7, 12, position=0, others=0)
    assert len(set(alone)) > 3  # the stream advances between steps
    assert _run_request(7, 12, position=0, others=0, sampler_seed=99) == alone
    assert _run_request(7, 12, position=3, others=5) == alone
    assert _run_request(7, 12, position=6, others=6, sampler_seed=1) == alone
    assert _run_request(7, 12, position=1, others=9) == alone


def test_different_seeds_and_sequences_differ_but_reproduce():
    a = _run_request(7, 12, position=0, others=0)
    b = _run_request(8, 12, position=0, others=0)
    assert a != b
    seq1 = _run_request(7, 12, position=0, others=2, seq_index=1)
    seq2 = _run_request(7, 12, position=2, others=2, seq_index=2)
    assert len({tuple(a), tuple(seq1), tuple(seq2)}) == 3
    assert _run_request(7, 12, position=1, others=4, seq_index=1) == seq1
    assert _run_request(7, 12, position=0, others=0, seq_index=2) == seq2


def test_n_sequences_of_one_request_in_one_batch():
    """n=3 sequences of a seeded request sampled together, then each alone."""
    p = SamplingParams(n=3, temperature=1.0, seed=42)
    x = _row_logits(0).expand(3, V).contiguous()
    together = _sampler()(x, _meta([p] * 3, generators=[make_generator(42, i) for i in range(3)])).token_ids
    assert len(set(together.tolist())) == 3
    for i in range(3):
        alone = _sampler(5)(x[:1], _meta([p], generators=[make_generator(42, i)])).token_ids
        assert int(alone) == int(together[i])


def test_generators_and_derived_seeds():
    assert derive_seed(1, 1) != derive_seed(2, 0)  # not seed + index
    assert derive_seed(1, 1) == derive_seed(1, 1) and 0 <= derive_seed(2**80, 3) < 2**63
    with pytest.raises(ValueError, match="seq_index must be a non-negative int"):
        make_generator(1, -1)
    with pytest.raises(TypeError, match="seed must be an int"):
        make_generator("1")
    # Greedy rows never advance their generator.
    g = make_generator(3)
    state = g.get_state()
    _sampler()(torch.randn(1, 8), _meta([SamplingParams(temperature=0.0, seed=3)], generators=[g]))
    assert torch.equal(g.get_state(), state)


def test_unseeded_rows_follow_sampler_seed():
    x = _row_logits(1).expand(64, V).contiguous()
    params = [SamplingParams()] * 64
    a = _sampler(11)(x, _meta(params)).token_ids
    b = _sampler(11)(x, _meta(params)).token_ids
    c = _sampler(12)(x, _meta(params)).token_ids
    assert torch.equal(a, b) and not torch.equal(a, c)


# -- sampler: the distribution is right ----------------------------------------------

# Chi-square critical values at p = 1e-3 by degrees of freedom.
_CHI2_CRIT = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52}


def _chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    n = counts.sum()
    keep = probs > 0
    expected = probs[keep] * n
    return float(((counts[keep] - expected) ** 2 / expected).sum())


@pytest.mark.parametrize("per_row_generators", [False, True])
def test_empirical_distribution_with_temperature(per_row_generators):
    logits = torch.tensor([1.0, 0.2, -0.5, 0.7, 0.0, -1.5], dtype=torch.float64)
    t = 0.8
    probs = torch.softmax(logits / t, dim=-1)
    n = 20000
    if per_row_generators:
        p = SamplingParams(temperature=t, seed=1)
        gens = [make_generator(i, 0) for i in range(n)]  # one seeded request per row
    else:
        p = SamplingParams(temperature=t)
        gens = None
    tokens = _sampler(2)(logits.expand(n, 6).contiguous(), _meta([p] * n, generators=gens)).token_ids
    counts = torch.bincount(tokens, minlength=6).double()
    assert _chi_square(counts, probs) < _CHI2_CRIT[5]


def test_empirical_distribution_after_filters():
    logits = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5], dtype=torch.float64)
    p = SamplingParams(temperature=1.0, top_k=4, top_p=0.8)
    # Expected: softmax over the top-4, then the top-p set of that renormalised distribution.
    top4 = torch.softmax(logits[:4], dim=-1)
    cum_before = torch.cumsum(top4, 0) - top4
    kept = cum_before < 0.8
    expected = torch.zeros(6, dtype=torch.float64)
    expected[:4][kept] = top4[kept] / top4[kept].sum()
    n = 20000
    tokens = _sampler(4)(logits.expand(n, 6).contiguous(), _meta([p] * n)).token_ids
    counts = torch.bincount(tokens, minlength=6).double()
    assert (counts[expected == 0] == 0).all()
    assert _chi_square(counts, expected) < _CHI2_CRIT[int((expected > 0).sum()) - 1]


def test_one_seeded_stream_over_many_steps_matches_distribution():
    """The same row sampled over many steps from one advancing generator."""
    logits = torch.tensor([[0.3, -0.2, 0.9, 0.0]])
    probs = torch.softmax(logits[0].double(), dim=-1)
    p = SamplingParams(seed=9)
    g = make_generator(9)
    s = _sampler()
    counts = torch.zeros(4, dtype=torch.float64)
    for _ in range(3000):
        counts[int(s(logits, _meta([p], generators=[g])).token_ids)] += 1
    assert _chi_square(counts, probs) < _CHI2_CRIT[3]


def test_empty_batch():
    out = _sampler()(torch.zeros(0, 5), _meta([]))
    assert out.token_ids.shape == (0,)


def test_default_sampler_resolves_from_process_registry():
    s = Sampler(seed=0)
    assert set(s.ops.providers) == {"sample.apply_penalties", "sample.topk_topp_minp", "sample.exponential_race"}
    out = s(torch.tensor([[0.0, 3.0, 1.0]]), _meta([SamplingParams(temperature=0.0)]))
    assert out.token_ids.tolist() == [1]
