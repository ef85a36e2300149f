"""Speculative decoding with DSpark in the engine (issue 9).

Two tiny V4.1 checkpoints: the random "flash" one (the draft almost never agrees: verification
rejects nearly everything, which exercises rollback on every step) and the agreeing one
(``agreeing_checkpoint.py``: target and draft follow one synthetic language, acceptance ~3.6
of 5). On the CPU platform the kernels are batch-invariant, so a verify row equals the
one-token decode row bit for bit and greedy outputs with DSpark on must EQUAL outputs with it
off, token ids and logprobs, with async scheduling (the default) and without.
"""
from __future__ import annotations

import json

import jsonschema
import pytest

from deepinfer_core.llm import LLM
from deepinfer_core.sampling_params import SamplingParams
from deepinfer_core.structured.params import StructuredOutputsParams
from deepinfer_models.deepseek_v41.agreeing_checkpoint import write_agreeing_v41_checkpoint
from tests.models.v41_helpers import prompt, tiny_ckpt

SPEC = {"num_speculative_tokens": 5}
# a verify token costs ~6% of a request's step share (CPU tiny model, measured order of magnitude)
COST_TABLE = {1: 1.0, 64: 1.0 + 63 * 0.06}


@pytest.fixture(scope="module")
def agreeing(tmp_path_factory):
    d = tmp_path_factory.mktemp("agree")
    lang = write_agreeing_v41_checkpoint(d)
    return d, lang


def _run(model_dir, prompts, params, spec=None, **kw):
    llm = LLM(str(model_dir), dtype="float32", speculative_config=spec, **kw)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outs], llm.llm_engine.spec_decode_stats()


def _lp(outs):
    return [(ids, [{t: (v.logprob, v.rank) for t, v in d.items()} for d in (lps or [])]) for ids, lps in outs]


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_greedy_with_dspark_equals_without_random_draft(async_scheduling):
    prompts = [prompt(n, seed=60 + n) for n in (5, 17, 33, 70)]
    params = SamplingParams(temperature=0, max_tokens=14, logprobs=2)
    base, _ = _run(tiny_ckpt("flash", "none"), prompts, params, max_num_batched_tokens=24, async_scheduling=False)
    spec, stats = _run(tiny_ckpt("flash", "none"), prompts, params, spec=SPEC, max_num_batched_tokens=24,
                       async_scheduling=async_scheduling)
    assert _lp(spec) == _lp(base)
    assert stats["num_drafts"] > 0 and stats["num_verified_tokens"] > 0


def test_agreeing_checkpoint_accepts_and_stays_lossless(agreeing):
    d, lang = agreeing
    prompts = [lang.prompt(10 + 9 * i, start_token=lang.tokens[(5 * i) % len(lang.tokens)]) for i in range(6)]
    params = SamplingParams(temperature=0, max_tokens=48, logprobs=1)  # long enough that end effects are small
    base, _ = _run(d, prompts, params)
    spec, st = _run(d, prompts, params, spec={**SPEC, "confidence_scheduling": False})
    assert _lp(spec) == _lp(base)
    sync, _ = _run(d, prompts, params, spec={**SPEC, "confidence_scheduling": False}, async_scheduling=False)
    assert _lp(sync) == _lp(base)
    for p, (ids, _) in zip(prompts, base):  # the target follows the language
        t = p[-1]
        for x in ids:
            t = lang.target_next(t)
            assert x == t
    print("acceptance", st)
    assert st["mean_acceptance_length"] - 1 > 3.0  # accepted drafts per draft step, of 5
    assert st["num_target_steps"] < 0.4 * 48  # far fewer target steps than tokens


def test_confidence_scheduling_verifies_fewer_and_keeps_the_accepted(agreeing):
    d, lang = agreeing
    prompts = [lang.prompt(12 + 5 * i, start_token=lang.tokens[(3 * i) % len(lang.tokens)]) for i in range(8)]
    params = SamplingParams(temperature=0, max_tokens=30)
    allv, s_all = _run(d, prompts, params, spec={**SPEC, "confidence_scheduling": False})
    conf, s_conf = _run(d, prompts, params, spec={**SPEC, "confidence_scheduling": True, "cost_table": COST_TABLE})
    assert [o for o, _ in conf] == [o for o, _ in allv]  # lossless either way
    per_all = s_all["num_verified_tokens"] / s_all["num_drafts"]
    per_conf = s_conf["num_verified_tokens"] / s_conf["num_drafts"]
    rate_all = s_all["num_accepted_tokens"] / s_all["num_drafts"]
    rate_conf = s_conf["num_accepted_tokens"] / s_conf["num_drafts"]
    print(f"verified/draft step {per_all:.2f} -> {per_conf:.2f}; accepted/draft step {rate_all:.2f} -> {rate_conf:.2f}")
    assert per_conf < 0.85 * per_all
    assert rate_conf >= 0.95 * rate_all


def test_seeded_sampling_with_dspark_is_reproducible_and_batch_independent(agreeing):
    d, lang = agreeing
    target = lang.prompt(20, start_token=lang.tokens[0])
    others = [lang.prompt(9 + i, start_token=lang.tokens[4 + i]) for i in range(3)]
    params = SamplingParams(temperature=0.8, top_p=0.95, seed=1234, max_tokens=20, logprobs=1)
    spec = {**SPEC, "confidence_scheduling": False}
    alone, st = _run(d, [target], params, spec=spec)
    batch, _ = _run(d, others[:1] + [target] + others[1:], params, spec=spec)
    assert _lp([batch[1]]) == _lp(alone)
    again, _ = _run(d, [target], params, spec=spec)
    assert _lp(again) == _lp(alone)
    assert st["num_accepted_tokens"] > 0


def test_probabilistic_drafts_n_and_stop_tokens(agreeing):
    d, lang = agreeing
    p = lang.prompt(15, start_token=lang.tokens[2])
    stop = lang.target_next(lang.target_next(lang.target_next(p[-1])))  # the 3rd generated token
    greedy_stop = SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[stop])
    (ids, _), = _run(d, [p], greedy_stop, spec=SPEC)[0]
    assert ids[-1] == stop and len(ids) == 3  # a stop token inside an accepted run ends the request there
    exact = SamplingParams(temperature=0, max_tokens=7)
    (ids, _), = _run(d, [p], exact, spec=SPEC)[0]
    assert len(ids) == 7  # never past max_tokens, whatever was accepted
    sampled = SamplingParams(temperature=1.0, n=3, seed=7, max_tokens=10)
    llm = LLM(str(d), dtype="float32", speculative_config={**SPEC, "draft_sample_method": "probabilistic"})
    out = llm.generate([{"prompt_token_ids": p}], sampled, use_tqdm=False)[0]
    assert len(out.outputs) == 3 and all(len(o.token_ids) == 10 for o in out.outputs)
    assert llm.llm_engine.spec_decode_stats()["num_accepted_tokens"] > 0


def test_structured_output_with_dspark_matches_without():
    schema = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                               "b": {"enum": ["x", "yy"]}}, "required": ["a", "b"]}
    sp = SamplingParams(temperature=0, max_tokens=40,
                        structured_outputs=StructuredOutputsParams(json=schema))
    prompts = [prompt(12, seed=3), prompt(30, seed=4)]
    outs = []
    for spec in (None, SPEC):
        llm = LLM(str(tiny_ckpt("flash", "none")), dtype="float32", speculative_config=spec)
        res = llm.generate([{"prompt_token_ids": q} for q in prompts], sp, use_tqdm=False)
        outs.append([r.outputs[0].text for r in res])
    assert outs[0] == outs[1]
    for text in outs[1]:
        jsonschema.validate(json.loads(text), schema)


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_preemption_and_chunking_with_dspark_equal_plain(agreeing, async_scheduling):
    d, lang = agreeing
    prompts = [lang.prompt(40 + 11 * i, start_token=lang.tokens[i]) for i in range(5)]
    params = SamplingParams(temperature=0, max_tokens=40)
    base, _ = _run(d, prompts, params)
    llm = LLM(str(d), dtype="float32", speculative_config=SPEC, kv_cache_memory_bytes=3_000_000,
              max_num_batched_tokens=16, async_scheduling=async_scheduling)  # 11 blocks for 5 requests
    sched, preempted = llm.llm_engine.scheduler, []
    real = sched._preempt
    sched._preempt = lambda req, out: (preempted.append(req.request_id), real(req, out))
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert preempted, "the budget was meant to force preemption"
    assert [o.outputs[0].token_ids for o in outs] == [o for o, _ in base]
    assert llm.llm_engine.kv.num_free_blocks == llm.llm_engine.kv.num_usable_blocks  # every block returned


def test_bad_speculative_configs_fail_clearly(tmp_path):
    d = tiny_ckpt("flash", "none")
    with pytest.raises(ValueError, match="unknown keys"):
        LLM(str(d), dtype="float32", speculative_config={"num_spec_tokens": 3})
    with pytest.raises(ValueError, match="compressor ring"):
        LLM(str(d), dtype="float32", speculative_config={"num_speculative_tokens": 7})
    from deepinfer_models.deepseek_v4.checkpoint_writer import write_tiny_v4_checkpoint
    v4 = write_tiny_v4_checkpoint(tmp_path / "v4")
    with pytest.raises(ValueError, match="no speculative proposer"):
        LLM(str(v4), dtype="float32", speculative_config=SPEC)
