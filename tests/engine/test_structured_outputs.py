"""Structured outputs through xgrammar: the model is random, only the grammar makes the output valid."""
from __future__ import annotations

import json
import re

import jsonschema
import pytest

from deepinfer_core import LLM, SamplingParams
from deepinfer_core.structured import StructuredOutputsParams as SO
from tests.engine.conftest import random_prompt

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                      "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
                                      "count": {"type": "integer", "minimum": -5, "maximum": 5}},
     "required": ["color", "count"], "additionalProperties": False},
    {"type": "object", "properties": {"grid": {"type": "array", "minItems": 1, "maxItems": 3,
                                               "items": {"type": "array", "maxItems": 3,
                                                         "items": {"type": "integer", "minimum": 0, "maximum": 9}}},
                                      "ok": {"type": "boolean"}},
     "required": ["grid", "ok"], "additionalProperties": False},
]
REGEXES = [
    r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])",          # date
    r"[a-z]{1,8}@[a-z]{1,8}\.(com|org|net)",                  # email
    r"\(\d{3}\) \d{3}-\d{4}",                                 # phone number
]
# Bounded repetition so that a random model must finish; still the arithmetic grammar's language.
ARITH = 'root ::= expr\nexpr ::= term (("+" | "-") term){0,3}\nterm ::= factor (("*" | "/") factor){0,2}\n' \
        'factor ::= [0-9] | "(" [0-9] ("+" | "-") [0-9] ")"'


def parse_arith(s: str) -> bool:
    """Recursive-descent check of the arithmetic grammar above (independent of xgrammar)."""
    pos = 0

    def factor():
        nonlocal pos
        if pos < len(s) and s[pos].isdigit():
            pos += 1
            return True
        if pos < len(s) and s[pos] == "(":
            pos += 1
            if not expr() or pos >= len(s) or s[pos] != ")":
                return False
            pos += 1
            return True
        return False

    def chain(sub, ops):
        nonlocal pos
        if not sub():
            return False
        while pos < len(s) and s[pos] in ops:
            pos += 1
            if not sub():
                return False
        return True

    def term():
        return chain(factor, "*/")

    def expr():
        return chain(term, "+-")

    return expr() and pos == len(s)


def constrained_params():
    out = []
    for i, schema in enumerate(SCHEMAS):
        out.append(("json", schema, SamplingParams(temperature=0.0, max_tokens=120, structured_outputs=SO(json=schema))))
        out.append(("json", schema, SamplingParams(temperature=1.0, seed=10 + i, max_tokens=120,
                                                    structured_outputs={"json": json.dumps(schema)})))
    for i, rx in enumerate(REGEXES):
        out.append(("regex", rx, SamplingParams(temperature=0.0, max_tokens=40, structured_outputs=SO(regex=rx))))
        out.append(("regex", rx, SamplingParams(temperature=1.0, seed=20 + i, max_tokens=40,
                                                 structured_outputs=SO(regex=rx))))
    out.append(("grammar", ARITH, SamplingParams(temperature=0.0, max_tokens=100, structured_outputs=SO(grammar=ARITH))))
    out.append(("grammar", ARITH, SamplingParams(temperature=1.0, seed=3, max_tokens=100,
                                                  structured_outputs=SO(grammar=ARITH))))
    out.append(("json_object", None, SamplingParams(temperature=1.0, seed=4, max_tokens=60,
                                                     structured_outputs=SO(json_object=True))))
    return out


FREE = [SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True),
        SamplingParams(temperature=0.8, seed=5, max_tokens=10, ignore_eos=True, logprobs=2)]


@pytest.fixture(scope="module")
def llm(tiny_v4_dir):
    return LLM(str(tiny_v4_dir), dtype="float32", max_model_len=256, kv_cache_memory_bytes=64 << 20)


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_constrained_outputs_validate_and_free_requests_are_unchanged(tiny_v4_dir, llm, async_scheduling):
    free_prompts = [random_prompt(30, 1), random_prompt(50, 2)]
    alone = llm.generate(free_prompts, FREE, use_tqdm=False)
    cases = constrained_params()
    engine = LLM(str(tiny_v4_dir), dtype="float32", max_model_len=256, kv_cache_memory_bytes=64 << 20,
                 async_scheduling=async_scheduling, max_num_batched_tokens=64)  # chunked prefill too
    prompts = [free_prompts[0]] + [random_prompt(20, 100 + i) for i in range(len(cases))] + [free_prompts[1]]
    params = [FREE[0]] + [c[2] for c in cases] + [FREE[1]]
    outs = engine.generate(prompts, params, use_tqdm=False)
    for (kind, spec, _), out in zip(cases, outs[1:-1]):
        o = out.outputs[0]
        assert out.error is None
        if kind == "json_object" and o.finish_reason == "length":
            # free-form JSON has unbounded strings: a random model may not close them in time
            assert o.text.startswith("{")
            continue
        assert o.finish_reason == "stop", f"{kind} {spec!r} did not finish: {o.text!r}"
        if kind == "json":
            jsonschema.validate(json.loads(o.text), spec)
        elif kind == "json_object":
            assert isinstance(json.loads(o.text), dict)
        elif kind == "regex":
            assert re.fullmatch(spec, o.text), (spec, o.text)
        else:
            assert parse_arith(o.text), o.text
    for got, ref in zip((outs[0], outs[-1]), alone):
        assert got.outputs[0].token_ids == ref.outputs[0].token_ids
        assert got.outputs[0].logprobs == ref.outputs[0].logprobs


def test_choice_and_n_sequences(llm):
    choices = ["alpha", "beta", "gamma delta"]
    sp = SamplingParams(n=4, temperature=1.0, seed=7, max_tokens=20, structured_outputs=SO(choice=choices))
    out = llm.generate([random_prompt(10, 9)], sp, use_tqdm=False)[0]
    assert len(out.outputs) == 4
    assert all(o.text in choices and o.finish_reason == "stop" for o in out.outputs)
    again = llm.generate([random_prompt(10, 9)], sp, use_tqdm=False)[0]
    assert [o.text for o in again.outputs] == [o.text for o in out.outputs]


def test_structured_chat(llm):
    schema = SCHEMAS[1]
    out = llm.chat([{"role": "user", "content": "Give me a color."}],
                   SamplingParams(temperature=0.0, max_tokens=60, structured_outputs=SO(json=schema)), use_tqdm=False)[0]
    jsonschema.validate(json.loads(out.outputs[0].text), schema)


@pytest.mark.parametrize("spec,needle", [
    (SO(regex="(unclosed"), "regex"),
    (SO(json="{not json"), "json"),
    (SO(json={"type": "object", "properties": {"a": {"type": "no-such-type"}}}), "json"),
    (SO(grammar="root ::= ( 'a'"), "grammar"),
])
def test_invalid_specs_fail_only_their_request(llm, spec, needle):
    ok = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    p = random_prompt(12, 5)
    ref = llm.generate([p], ok, use_tqdm=False)[0].outputs[0].token_ids
    outs = llm.generate([p, p, p], [ok, SamplingParams(max_tokens=5, structured_outputs=spec), ok], use_tqdm=False)
    assert outs[1].error is not None and needle in outs[1].error and outs[1].outputs[0].finish_reason == "error"
    assert outs[0].outputs[0].token_ids == ref and outs[2].outputs[0].token_ids == ref


def test_malformed_structured_params_are_rejected():
    with pytest.raises(ValueError, match="exactly one"):
        SO(regex="a", choice=["b"])
    with pytest.raises(ValueError, match="unknown structured_outputs keys"):
        SamplingParams(structured_outputs={"jsn": {}})
    with pytest.raises(ValueError, match="choice"):
        SO(choice=[])


def test_matcher_rollback_for_rejected_tokens(llm):
    """Speculative decoding will roll matchers back: accept, roll back, and the mask is as before."""
    from deepinfer_core.structured.xgrammar_backend import GrammarBackend

    eng = llm.llm_engine
    backend = GrammarBackend(eng.tokenizer, eng.vocab_size, list(eng.eos_token_ids))
    m = backend.matcher(backend.compile(SO(regex=r"\d{3}")))
    before = backend.fill_bitmask([m], [0], 1).clone()
    tok = eng.tokenizer.encode("7")[-1]
    assert m.accept_token(tok)
    assert not torch_equal(backend.fill_bitmask([m], [0], 1), before)
    m.rollback(1)
    assert torch_equal(backend.fill_bitmask([m], [0], 1), before)


def torch_equal(a, b):
    import torch

    return torch.equal(a, b)
