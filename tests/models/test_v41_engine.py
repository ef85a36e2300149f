"""The engine runs DeepSeek-V4.1 checkpoints: generate and chat (none / fp8 / fp4), greedy
decoding equal to the oracle's stateless recompute, batch invariance, the embedded default."""
from __future__ import annotations

import pytest
import torch

from deepinfer_core import LLM, SamplingParams
from tests.models.v41_helpers import prompt, tiny_ckpt
from tests.oracle.v41_reference import RefV41

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def make(d, **kw):
    kw.setdefault("kv_cache_memory_bytes", 64 << 20)
    return LLM(str(d), dtype="float32", max_model_len=512, **kw)


@pytest.mark.parametrize("quant", ["none", "fp8", "fp4"])
def test_generate_and_chat(quant):
    llm = make(tiny_ckpt("flash", quant))
    engine = llm.llm_engine
    assert engine.architecture == "DeepseekV41ForCausalLM" and engine.chat_encoding == "v41"
    out = llm.generate(["The capital of France is", prompt(40, 1)], GREEDY, use_tqdm=False)
    for o in out:
        assert o.error is None and len(o.outputs[0].token_ids) == 6 and o.outputs[0].finish_reason == "length"
    assert isinstance(out[0].outputs[0].text, str)
    chat = llm.chat([[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}],
                     [{"role": "user", "content": "2+2?"}]], GREEDY, use_tqdm=False)
    assert [c.error for c in chat] == [None, None]
    assert all(len(c.outputs[0].token_ids) == 6 for c in chat)
    img = llm.generate([{"prompt": "look", "multi_modal_data": {"image": b"..."}}], GREEDY, use_tqdm=False)[0]
    assert img.error is not None and "image" in img.error


def test_greedy_generation_matches_the_oracle_recompute():
    d = tiny_ckpt("mixed", "fp4")
    p = prompt(30, 5)
    ours = make(d).generate([p], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
                            use_tqdm=False)[0].outputs[0].token_ids
    ref, ids = RefV41(d), list(p)
    for _ in range(8):
        ids.append(int(torch.argmax(ref.logits(ids)[-1])))
    assert ours == ids[len(p):]


def test_batched_and_chunked_equal_alone_bit_for_bit():
    d = tiny_ckpt("flash", "fp8")
    seeded = SamplingParams(temperature=0.8, top_p=0.9, seed=3, max_tokens=10, logprobs=2, ignore_eos=True)
    a, b = prompt(120, 8), prompt(25, 9)

    def sig(o):
        return o.outputs[0].token_ids, [sorted((k, v.logprob) for k, v in lp.items()) for lp in o.outputs[0].logprobs]

    alone = [sig(make(d, async_scheduling=False).generate([p], seeded, use_tqdm=False)[0]) for p in (a, b)]
    mixed = make(d, max_num_batched_tokens=16).generate([b, a], seeded, use_tqdm=False)
    assert [sig(o) for o in mixed] == alone[::-1]


def test_embedded_default_is_a_tiny_v41(monkeypatch, tmp_path):
    from deepinfer_models import registry

    assert next(iter(registry.EMBEDDED_BUILDERS)) == registry.EMBEDDED_DEFAULT == "deepinfer/tiny-v41"
    assert "deepinfer/tiny-v4" in registry.EMBEDDED_BUILDERS
    monkeypatch.setenv("DEEPINFER_CACHE", str(tmp_path))
    llm = LLM("deepinfer/tiny-v41", dtype="float32", max_model_len=128, kv_cache_memory_bytes=16 << 20)
    assert llm.llm_engine.architecture == "DeepseekV41ForCausalLM"
    assert llm.llm_engine.model.cfg.quant.expert_dtype == "fp8"  # the fp8 variant, seed 0
    out = llm.generate(["Hello"], GREEDY, use_tqdm=False)[0]
    assert out.error is None and len(out.outputs[0].token_ids) == 6


def test_prefix_cache_hits_are_bit_identical_to_cold_runs():
    """Shared 200-token prefix (block-aligned hits of 128) and an exact repeat (the hit covers the whole
    prompt): the Engram history is rebuilt by replaying ``prefix_replay_tokens`` tokens before the hit."""
    d = tiny_ckpt("flash", "fp8")
    system = prompt(200, 12)
    prompts = [system + prompt(9, 20), system + prompt(30, 21), system[:128]]
    sp = SamplingParams(temperature=0.9, seed=4, max_tokens=6, logprobs=2, ignore_eos=True)

    def sig(o):
        return o.outputs[0].token_ids, [sorted((k, v.logprob) for k, v in lp.items()) for lp in o.outputs[0].logprobs]

    cold_llm = make(d, enable_prefix_caching=False)
    cold = [sig(cold_llm.generate([p], sp, use_tqdm=False)[0]) for p in prompts]
    llm = make(d)
    assert llm.llm_engine.model.prefix_replay_tokens() == 4  # N-gram size of the flash topology
    warm = [sig(llm.generate([p], sp, use_tqdm=False)[0]) for p in prompts + prompts]
    assert warm == cold + cold
    assert llm.llm_engine.kv.num_hit_tokens > 0
