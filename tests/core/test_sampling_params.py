"""SamplingParams: vLLM defaults, normalisation, validation messages, clone."""
from __future__ import annotations

import re

import pytest

from deepinfer_core.sampling_params import SAMPLING_EPS, SamplingParams


def test_defaults_match_vllm():
    p = SamplingParams()
    assert (p.n, p.temperature, p.top_p, p.top_k, p.min_p) == (1, 1.0, 1.0, 0, 0.0)
    assert (p.seed, p.max_tokens, p.min_tokens) == (None, 16, 0)
    assert p.stop == [] and p.stop_token_ids == []
    assert p.ignore_eos is False and p.logprobs is None and p.prompt_logprobs is None
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.0, 0.0, 1.0)
    assert p.include_stop_str_in_output is False and p.skip_special_tokens is True
    assert p.structured_outputs is None and p.detokenize is True
    assert not p.greedy and not p.has_penalties


def test_normalisation():
    assert SamplingParams(stop="###").stop == ["###"]
    assert SamplingParams(stop=("a", "b")).stop == ["a", "b"]
    assert SamplingParams(stop_token_ids=[5, 3, 5, 7, 3]).stop_token_ids == [5, 3, 7]
    assert SamplingParams(seed=-1).seed is None
    assert SamplingParams(seed=0).seed == 0
    assert SamplingParams(logprobs=True).logprobs == 1
    assert SamplingParams(prompt_logprobs=True).prompt_logprobs == 1
    assert SamplingParams(max_tokens=None).max_tokens is None
    assert SamplingParams(top_k=-1).top_k == -1 and not SamplingParams(top_k=-1).top_k_enabled


def test_greedy_property_threshold():
    assert SamplingParams(temperature=0.0).greedy
    assert SamplingParams(temperature=SAMPLING_EPS / 2).greedy
    assert not SamplingParams(temperature=SAMPLING_EPS).greedy
    assert not SamplingParams(temperature=0.7).greedy


def test_has_penalties():
    assert SamplingParams(repetition_penalty=1.1).has_penalties
    assert SamplingParams(frequency_penalty=-0.5).has_penalties
    assert SamplingParams(presence_penalty=0.1).has_penalties


@pytest.mark.parametrize("kwargs, message", [
    (dict(n=0), "n must be at least 1, got 0"),
    (dict(temperature=-1), "temperature must be non-negative, got -1"),
    (dict(temperature=float("inf")), "temperature must be a finite number, got inf"),
    (dict(top_p=1.5), "top_p must be in (0, 1], got 1.5"),
    (dict(top_p=0.0), "top_p must be in (0, 1], got 0.0"),
    (dict(top_k=-2), "top_k must be 0 or -1 (disabled) or at least 1, got -2"),
    (dict(min_p=-0.1), "min_p must be in [0, 1], got -0.1"),
    (dict(min_p=1.01), "min_p must be in [0, 1], got 1.01"),
    (dict(repetition_penalty=0.0), "repetition_penalty must be a finite number > 0, got 0.0"),
    (dict(repetition_penalty=-1.0), "repetition_penalty must be a finite number > 0, got -1.0"),
    (dict(presence_penalty=2.5), "presence_penalty must be in [-2, 2], got 2.5"),
    (dict(frequency_penalty=-2.01), "frequency_penalty must be in [-2, 2], got -2.01"),
    (dict(max_tokens=0), "max_tokens must be at least 1, got 0"),
    (dict(min_tokens=-1), "min_tokens must be non-negative, got -1"),
    (dict(min_tokens=20, max_tokens=10), "min_tokens must be at most max_tokens=10, got 20"),
    (dict(logprobs=-2), "logprobs must be non-negative (or -1 for the whole vocabulary), got -2"),
    (dict(prompt_logprobs=-5), "prompt_logprobs must be non-negative (or -1 for the whole vocabulary), got -5"),
    (dict(stop=["ok", ""]), "stop strings must be non-empty, got an empty string at index 1"),
    (dict(stop=""), "stop strings must be non-empty, got an empty string at index 0"),
    (dict(stop_token_ids=[3, -1]), "stop_token_ids must be non-negative, got -1 at index 1"),
    (dict(stop="x", detokenize=False), "stop strings need detokenize=True"),
    (dict(n=2, temperature=0.0), "n must be 1 when sampling greedily"),
])
def test_bad_values_raise_value_error(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("kwargs, message", [
    (dict(n=2.0), "n must be an int, got float"),
    (dict(n=True), "n must be an int, got bool"),
    (dict(top_k=1.5), "top_k must be an int, got float"),
    (dict(seed="7"), "seed must be an int or None, got str"),
    (dict(max_tokens=3.0), "max_tokens must be an int or None, got float"),
    (dict(logprobs=2.5), "logprobs must be an int or None, got float"),
    (dict(temperature="hot"), "temperature must be a number, got str"),
    (dict(top_p=None), "top_p must be a number, got NoneType"),
    (dict(ignore_eos=1), "ignore_eos must be a bool, got int"),
    (dict(stop=5), "stop must be a str, a list of str or None, got int"),
    (dict(stop=["a", 3]), "stop must be a str or a list of str"),
    (dict(stop_token_ids=7), "stop_token_ids must be a list of int or None, got int"),
    (dict(stop_token_ids=[1, "2"]), "stop_token_ids must be a list of int"),
])
def test_bad_types_raise_type_error(kwargs, message):
    with pytest.raises(TypeError, match=re.escape(message)):
        SamplingParams(**kwargs)


def test_validate_catches_later_mutation():
    p = SamplingParams()
    p.top_p = 2.0
    with pytest.raises(ValueError, match=re.escape("top_p must be in (0, 1], got 2.0")):
        p.validate()


def test_edge_values_are_accepted():
    SamplingParams(top_p=1.0, min_p=1.0, top_k=1, presence_penalty=-2, frequency_penalty=2,
                   repetition_penalty=1e-3, min_tokens=16, max_tokens=16, logprobs=0, prompt_logprobs=-1)
    SamplingParams(n=4, temperature=0.5, seed=2**70)  # arbitrary-size seeds are hashed by the sampler
    SamplingParams(n=1, temperature=0.0, seed=3)


def test_clone_is_independent():
    from deepinfer_core.structured import StructuredOutputsParams

    obj = StructuredOutputsParams(regex="[a-z]+")
    p = SamplingParams(stop=["a"], stop_token_ids=[1], seed=5, structured_outputs=obj)
    c = p.clone()
    assert c == p and c is not p
    c.stop.append("b")
    c.stop_token_ids.append(2)
    c.temperature = 0.3
    assert p.stop == ["a"] and p.stop_token_ids == [1] and p.temperature == 1.0
    assert c.structured_outputs is obj
