"""Prefix caching: hits are bit-identical to cold runs, save prefill, survive eviction."""
from __future__ import annotations

import pytest

from deepinfer_core import SamplingParams
from deepinfer_core.kv.block_pool import BlockPool
from tests.engine.conftest import make, random_prompt, sig

SYSTEM = random_prompt(300, 4242)
QUESTIONS = [random_prompt(10 + 7 * i, 700 + i) for i in range(6)]
PARAMS = [SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=2),
          SamplingParams(temperature=0.9, seed=11, max_tokens=8, ignore_eos=True, logprobs=2)]


@pytest.fixture(scope="module")
def cold(tiny_v4_dir):
    llm = make(tiny_v4_dir, enable_prefix_caching=False)
    return [[sig(llm.generate([SYSTEM + q], sp, use_tqdm=False)[0]) for sp in PARAMS] for q in QUESTIONS]


def test_shared_system_prompt_hits_are_bit_identical(tiny_v4_dir, cold):
    llm = make(tiny_v4_dir)
    eng = llm.llm_engine
    first = [sig(o) for o in llm.generate([SYSTEM + QUESTIONS[0]], PARAMS[0], use_tqdm=False)]
    assert first[0] == cold[0][0]
    before = eng.prefix_cache_stats()["hit_tokens"]
    outs = llm.generate([SYSTEM + q for q in QUESTIONS for _ in PARAMS], [sp for _ in QUESTIONS for sp in PARAMS],
                        use_tqdm=False)
    for i, q in enumerate(QUESTIONS):
        for j in range(len(PARAMS)):
            assert sig(outs[i * len(PARAMS) + j]) == cold[i][j], f"question {i} params {j}"
    stats = eng.prefix_cache_stats()
    # 256 of the 300 system-prompt tokens are block-aligned (128); minus 4 replayed tokens
    assert stats["hit_tokens"] - before >= len(QUESTIONS) * len(PARAMS) * (256 - 4)
    assert eng.kv.num_free_blocks == eng.kv.num_usable_blocks


def test_multi_turn_reuses_previous_turn(tiny_v4_dir):
    llm = make(tiny_v4_dir)
    cold_llm = make(tiny_v4_dir, enable_prefix_caching=False)
    sp = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    turn1 = SYSTEM[:200]
    out1 = llm.generate([turn1], sp, use_tqdm=False)[0].outputs[0].token_ids
    turn2 = turn1 + out1 + QUESTIONS[1]
    hits = llm.llm_engine.kv.num_hit_tokens
    got = llm.generate([turn2], sp, use_tqdm=False)[0].outputs[0].token_ids
    assert llm.llm_engine.kv.num_hit_tokens - hits == 128 - 4
    assert got == cold_llm.generate([turn2], sp, use_tqdm=False)[0].outputs[0].token_ids


def test_eviction_under_tiny_budget_never_corrupts(tiny_v4_dir, cold):
    probe = make(tiny_v4_dir)
    per_block = sum(s.page_bytes for s in probe.llm_engine.executor.specs.values() if hasattr(s, "page_bytes"))
    llm = make(tiny_v4_dir, kv_cache_memory_bytes=per_block * 30)
    eng = llm.llm_engine
    prompts = [SYSTEM + q for q in QUESTIONS] + [random_prompt(250, 90 + i) for i in range(4)]
    order = [0, 6, 1, 7, 2, 8, 3, 9, 4, 5]
    for rnd in range(2):
        outs = llm.generate([prompts[k] for k in order], PARAMS[rnd], use_tqdm=False)
        for k, out in zip(order, outs):
            if k < len(QUESTIONS):
                assert sig(out) == cold[k][rnd]
    assert eng.kv.pool.num_evictions > 0, "the budget was meant to force evictions"
    assert eng.kv.num_free_blocks == eng.kv.num_usable_blocks


def test_block_pool_lru_cache_accounting():
    pool = BlockPool(5)  # ids 1..4
    a, b = pool.allocate(2)
    pool.set_block_hash(a, 111)
    pool.set_block_hash(b, 222)
    pool.free([a, b])
    assert pool.num_free_blocks == 4 and pool.lookup(111) == a and pool.num_cached_blocks == 2
    pool.touch(a)  # a prefix hit takes the cached block back
    assert pool.ref_count(a) == 1 and pool.num_free_blocks == 3
    got = pool.allocate(3)  # takes the two never-used blocks first, then evicts b (least recently freed)
    assert b in got and pool.lookup(222) is None and pool.num_evictions == 1
    assert pool.lookup(111) == a
    pool.free(got + [a])
    assert pool.num_free_blocks == 4
