"""Prefix-cache host tier: evicted cached blocks spill to host memory and come back on a hit.

Engine tests run a device pool too small to keep a shared prefix across unrelated requests
and check that a later request with the prefix is served from the host tier with greedy and
seeded outputs (tokens and logprobs) bit-identical to a cold run (the CPU kernels are
batch-invariant). Unit tests cover the host LRU, the manager's copy list and its order, and
the tensor store.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from deepinfer_core import SamplingParams
from deepinfer_core.config import EngineConfig
from deepinfer_core.kv.host_tier import DROP, RESTORE, SPILL, HostCopy, HostTier
from deepinfer_core.kv.manager import KVCacheManager
from deepinfer_core.kv.spec import CompressedSpec, SlidingWindowSpec
from deepinfer_core.request import Request
from deepinfer_core.runner.host_store import HostKVStore
from tests.engine.conftest import make, random_prompt, sig

SYSTEM = random_prompt(300, 4242)  # 256 block-aligned tokens (the tiny V4's HCA block is 128)
QUESTIONS = [random_prompt(10 + 7 * i, 700 + i) for i in range(4)]
FILLERS = [random_prompt(250, 90 + i) for i in range(3)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=2)
SEEDED = SamplingParams(temperature=0.9, seed=11, max_tokens=8, ignore_eos=True, logprobs=2)
POOL_BLOCKS = 30  # block ids (x 78080 B for the tiny V4): one 300-token request evicts another's prefix
# (prompt, params): the shared prefix, then fillers that push it out of the device pool, then the prefix again
WORKLOAD = [(SYSTEM + QUESTIONS[0], GREEDY), (FILLERS[0], GREEDY), (FILLERS[1], SEEDED),
            (SYSTEM + QUESTIONS[1], GREEDY), (FILLERS[2], GREEDY), (SYSTEM + QUESTIONS[2], SEEDED)]


def per_block_bytes(llm) -> int:
    return sum(s.page_bytes for s in llm.llm_engine.executor.specs.values() if hasattr(s, "page_bytes"))


@pytest.fixture(scope="module")
def cold(tiny_v4_dir):
    llm = make(tiny_v4_dir, enable_prefix_caching=False)
    prompts = [p for p, _ in WORKLOAD] + [SYSTEM + QUESTIONS[3]]
    return {(tuple(p), id(sp)): sig(llm.generate([p], sp, use_tqdm=False)[0])
            for p in prompts for sp in (GREEDY, SEEDED)}


@pytest.fixture(scope="module")
def pool_bytes(tiny_v4_dir):
    return per_block_bytes(make(tiny_v4_dir)) * POOL_BLOCKS


def run_workload(llm, cold):
    """Run WORKLOAD one request at a time; returns the per-request (hit tokens, host hits) deltas."""
    eng = llm.llm_engine
    deltas = []
    for p, sp in WORKLOAD:
        before = eng.prefix_cache_stats()
        out = llm.generate([p], sp, use_tqdm=False)[0]
        after = eng.prefix_cache_stats()
        assert sig(out) == cold[(tuple(p), id(sp))], f"request {len(deltas)} differs from the cold run"
        deltas.append((after["hit_tokens"] - before["hit_tokens"], after["host_hits"] - before["host_hits"]))
    return deltas


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_hit_served_from_host_is_bit_identical(tiny_v4_dir, cold, pool_bytes, async_scheduling):
    llm = make(tiny_v4_dir, kv_cache_memory_bytes=pool_bytes, host_kv_cache_bytes=64 << 20,
               async_scheduling=async_scheduling)
    eng = llm.llm_engine
    deltas = run_workload(llm, cold)
    # requests 3 (greedy) and 5 (seeded) find the 256-token prefix (minus 4 replayed tokens) on the host
    for k in (3, 5):
        assert deltas[k][0] >= 256 - 4 and deltas[k][1] == 1, deltas
    stats = eng.prefix_cache_stats()
    assert stats["host_blocks_restored"] > 0 and stats["host_blocks_spilled"] >= stats["host_blocks"] > 0
    assert stats["host_evictions"] == 0
    assert eng.host_store.bytes_used == stats["host_bytes"] == eng.kv.host.bytes_used
    assert len(eng.host_store.entries) == stats["host_blocks"]
    assert eng.kv.num_free_blocks == eng.kv.num_usable_blocks
    assert eng.kv.host.num_pending_ops == 0  # every recorded copy was applied


def test_without_host_tier_the_same_workload_misses(tiny_v4_dir, cold, pool_bytes):
    """The control: the device pool alone has lost the prefix by the time it comes back."""
    llm = make(tiny_v4_dir, kv_cache_memory_bytes=pool_bytes)
    deltas = run_workload(llm, cold)
    assert deltas[3][0] == 0 and deltas[5][0] == 0, deltas
    assert llm.llm_engine.host_store is None and llm.llm_engine.kv.host is None
    assert llm.llm_engine.prefix_cache_stats()["host_blocks_spilled"] == 0


def test_concurrent_requests_share_blocks_restored_in_the_same_step(tiny_v4_dir, cold, pool_bytes):
    """Several requests admitted in one step hit the same host prefix: the first restores it, the
    others find the restored (not yet copied) device blocks by hash; the copies run before the step."""
    llm = make(tiny_v4_dir, kv_cache_memory_bytes=pool_bytes, host_kv_cache_bytes=64 << 20)
    eng = llm.llm_engine
    llm.generate([SYSTEM + QUESTIONS[0]], GREEDY, use_tqdm=False)
    llm.generate(FILLERS[:2], GREEDY, use_tqdm=False)
    before = eng.prefix_cache_stats()
    prompts = [SYSTEM + q for q in QUESTIONS[1:]]
    outs = llm.generate(prompts, [GREEDY, SEEDED, GREEDY], use_tqdm=False)
    for p, sp, out in zip(prompts, [GREEDY, SEEDED, GREEDY], outs):
        assert sig(out) == cold[(tuple(p), id(sp))]
    after = eng.prefix_cache_stats()
    assert after["host_hits"] - before["host_hits"] >= 1
    assert after["hit_tokens"] - before["hit_tokens"] >= 3 * (256 - 4)
    assert eng.kv.num_free_blocks == eng.kv.num_usable_blocks


def test_small_host_budget_evicts_on_the_host_without_corruption(tiny_v4_dir, cold, pool_bytes):
    budget = 12 * 65536  # about a dozen sliding-window blocks (64 KiB each on the host): far less than spilled
    llm = make(tiny_v4_dir, kv_cache_memory_bytes=pool_bytes, host_kv_cache_bytes=budget)
    eng = llm.llm_engine
    for _ in range(2):
        run_workload(llm, cold)  # asserts every output equals the cold run
    stats = eng.prefix_cache_stats()
    assert stats["host_evictions"] > 0, "the budget was meant to force host-side evictions"
    assert 0 < stats["host_bytes"] <= budget
    assert eng.host_store.bytes_used == stats["host_bytes"] and len(eng.host_store.entries) == stats["host_blocks"]
    assert eng.kv.num_free_blocks == eng.kv.num_usable_blocks


@pytest.mark.parametrize("host_blocks", [1000, 6])
def test_batched_interleaved_workload_with_preemption(tiny_v4_dir, cold, pool_bytes, host_blocks):
    """Every prompt at once, twice, in a pool that holds about one request: preemptions, resumes
    and hits from both tiers interleave inside steps; no output may change."""
    llm = make(tiny_v4_dir, kv_cache_memory_bytes=pool_bytes, host_kv_cache_bytes=host_blocks * 65536)
    eng = llm.llm_engine
    prompts = [SYSTEM + q for q in QUESTIONS] + FILLERS
    order = [0, 4, 1, 5, 2, 6, 3]
    for sp in (GREEDY, SEEDED):
        outs = llm.generate([prompts[k] for k in order], sp, use_tqdm=False)
        for k, out in zip(order, outs):
            assert sig(out) == cold[(tuple(prompts[k]), id(sp))], f"prompt {k}"
    stats = eng.prefix_cache_stats()
    assert stats["host_hits"] > 0 and stats["host_bytes"] <= host_blocks * 65536
    assert eng.host_store.bytes_used == stats["host_bytes"]
    assert eng.kv.num_free_blocks == eng.kv.num_usable_blocks


def test_tier_off_is_identical_to_plain_prefix_caching(tiny_v4_dir, cold):
    plain = make(tiny_v4_dir)
    off = make(tiny_v4_dir, host_kv_cache_bytes=0)
    no_cache = make(tiny_v4_dir, enable_prefix_caching=False, host_kv_cache_bytes=64 << 20)
    assert no_cache.llm_engine.kv.host is None and no_cache.llm_engine.host_store is None  # needs prefix caching
    prompts = [SYSTEM + q for q in QUESTIONS[:3]]
    a = [sig(o) for o in plain.generate(prompts, GREEDY, use_tqdm=False)]
    b = [sig(o) for o in off.generate(prompts, GREEDY, use_tqdm=False)]
    assert a == b == [cold[(tuple(p), id(GREEDY))] for p in prompts]
    assert plain.llm_engine.prefix_cache_stats() == off.llm_engine.prefix_cache_stats()
    assert off.llm_engine.host_store is None and off.llm_engine.kv.take_host_copies() == []
    with pytest.raises(ValueError, match="host_kv_cache_bytes"):
        EngineConfig(model="x", host_kv_cache_bytes=-1)


def test_v41_hit_from_host_is_bit_identical(tmp_path):
    """DeepSeek-V4.1 (five groups, Engram replay): the same host round trip stays exact."""
    from deepinfer_models.testing import write_tiny_v41_checkpoint

    write_tiny_v41_checkpoint(tmp_path, quant="fp8", seed=3)
    system, fillers = random_prompt(200, 17), [random_prompt(180, 30 + i) for i in range(2)]
    probe = make(tmp_path)
    pool = per_block_bytes(probe) * 40
    seq = [system + QUESTIONS[0], *fillers, system + QUESTIONS[1]]
    cold_sigs = [sig(make(tmp_path, enable_prefix_caching=False).generate([p], sp, use_tqdm=False)[0])
                 for p, sp in zip(seq, [GREEDY, GREEDY, GREEDY, SEEDED])]
    llm = make(tmp_path, kv_cache_memory_bytes=pool, host_kv_cache_bytes=64 << 20)
    got = [sig(llm.generate([p], sp, use_tqdm=False)[0]) for p, sp in zip(seq, [GREEDY, GREEDY, GREEDY, SEEDED])]
    assert got == cold_sigs
    stats = llm.llm_engine.prefix_cache_stats()
    assert stats["host_hits"] >= 1 and stats["host_blocks_restored"] > 0
    assert llm.llm_engine.kv.num_free_blocks == llm.llm_engine.kv.num_usable_blocks


# -- unit tests: HostTier, the manager's copy list, HostKVStore ----------------------------------
def test_host_tier_lru_budget_pins_and_op_order():
    tier = HostTier(30, {0: 10, 1: 40})
    for k in (1, 2, 3):
        assert tier.spill(0, 10 + k, k)
    assert tier.spill(0, 99, 2) and tier.num_spilled == 3  # already there: moved to the LRU tail, no copy
    assert not tier.spill(1, 5, 7) and tier.num_skipped == 1  # larger than the whole budget
    tier.pin(0, 1)
    tier.restore(0, 20, 1)
    assert tier.spill(0, 14, 4)  # needs room: drops key 3 (LRU, 2 was touched, 1 pinned and restored)
    assert not tier.contains(0, 3) and tier.bytes_used == 30 and tier.num_evictions == 1
    ops = tier.take_ops()
    assert ops == [HostCopy(SPILL, 0, 11, 1), HostCopy(SPILL, 0, 12, 2), HostCopy(SPILL, 0, 13, 3),
                   HostCopy(RESTORE, 0, 20, 1), HostCopy(DROP, 0, -1, 3), HostCopy(SPILL, 0, 14, 4)]
    for k in (2, 4):
        tier.pin(0, k)
    tier.pin(0, 1)
    assert not tier.spill(0, 15, 5)  # everything pinned: the spill is skipped, nothing dropped
    assert tier.take_ops() == [] and tier.spill(0, 15, 5)  # unpinned by take_ops
    with pytest.raises(KeyError):
        tier.restore(0, 3, 3)


SWA = SlidingWindowSpec((3,), torch.float32, window=8, block_size=4)
C2 = CompressedSpec((2,), torch.float32, ratio=2, block_size=8)


def _fake_executor(kv: KVCacheManager) -> SimpleNamespace:
    """Caches of two SWA layers and one C2 layer, laid out like PagedExecutor's."""
    caches = {"s0": torch.zeros(kv.pool.num_blocks * 4, 3), "s1": torch.zeros(kv.pool.num_blocks * 4, 3),
              "c0": torch.zeros(kv.pool.num_blocks * 4, 2)}
    return SimpleNamespace(caches=caches, group_specs={0: SWA, 1: C2}, group_members={0: ["s0", "s1"], 1: ["c0"]},
                           device=torch.device("cpu"))


def _content(g: int, h: int, layer: int) -> float:
    return float((h % 99991) * 4 + layer + 1) * (1 if g == 0 else -1)


def _compute(kv, ex, store, req, n):
    """One engine step for ``req``: allocate n tokens, apply the copies recorded so far (as the
    engine does before a step), then 'compute': every full block holds a function of its hash."""
    assert kv.allocate_slots(req, n)
    ops = kv.take_host_copies()
    store.apply(ops)
    req.num_computed_tokens += n
    kv.cache_full_blocks(req)
    rb = kv._reqs[req.request_id]
    for g in (0, 1):
        e = ex.group_specs[g].entries_per_block
        for i, h in enumerate(rb.hashes[g]):
            b = rb.tables[g][i]
            for layer, name in enumerate(ex.group_members[g]):
                if b:
                    ex.caches[name][b * e:(b + 1) * e] = _content(g, h, layer)
    return ops


def _check_tables(kv, ex, req):
    rb = kv._reqs[req.request_id]
    for g in (0, 1):
        e = ex.group_specs[g].entries_per_block
        hashes = kv._hashes(req.all_token_ids, g, len(rb.tables[g]))
        for i, b in enumerate(rb.tables[g][:rb.num_hashed[g]]):
            for layer, name in enumerate(ex.group_members[g]):
                if b:
                    assert torch.all(ex.caches[name][b * e:(b + 1) * e] == _content(g, hashes[i], layer)), (g, i)


def test_manager_spills_on_eviction_and_restores_in_order():
    tier = HostTier(1 << 20, {0: SWA.page_bytes * 2, 1: C2.page_bytes})
    kv = KVCacheManager([SWA, C2], [], num_blocks=9, max_num_seqs=4, enable_caching=True, host_tier=tier)
    ex = _fake_executor(kv)
    store = HostKVStore(ex)
    assert store.block_bytes() == tier.block_bytes
    a = Request("a", list(range(100, 116)), SimpleNamespace(max_tokens=4))
    assert _compute(kv, ex, store, a, 16) == []
    kv.free(a)  # 4 SWA + 2 C2 blocks stay cached on the device
    b = Request("b", list(range(200, 220)), SimpleNamespace(max_tokens=4))
    ops = _compute(kv, ex, store, b, 20)  # 8 blocks: the whole pool, so all of a's blocks are evicted
    assert sorted((op.kind, op.group) for op in ops) == [(SPILL, 0)] * 4 + [(SPILL, 1)] * 2
    kv.free(b)
    # a's prefix again: 16 tokens hit, SWA blocks 2-3 (the last window) and C2 blocks 0-1 come from the host
    a2 = Request("a2", list(range(100, 116)) + [7, 7, 7, 7], SimpleNamespace(max_tokens=4))
    h, r, tables = kv.find_prefix(a2)
    assert (h, r) == (16, 0) and len(tables.restores) == 4
    assert kv.allocate_prefix(a2, tables)
    ops = kv.take_host_copies()
    kinds = [op.kind for op in ops]
    # restoring takes 4 blocks, which evicts (and spills) 4 of b's first: spills precede the restores
    assert kinds == [SPILL] * 4 + [RESTORE] * 4
    assert {op.block_id for op in ops if op.kind == RESTORE} == {op.block_id for op in ops if op.kind == SPILL}
    store.apply(ops)
    _check_tables(kv, ex, a2)
    a2.num_computed_tokens = 16
    _compute(kv, ex, store, a2, 4)
    _check_tables(kv, ex, a2)
    # b's spilled blocks were read before the restores overwrote them
    for (g, key), t in store.entries.items():
        for layer in range(t.shape[0]):
            assert torch.all(t[layer] == _content(g, key, layer))
    kv.free(a2)
    assert kv.num_free_blocks == kv.num_usable_blocks
    assert store.bytes_used == tier.bytes_used and len(store.entries) == tier.num_blocks


def test_store_round_trip_and_duplicate_block_in_a_restore_run():
    kv = KVCacheManager([SWA, C2], [], num_blocks=6, max_num_seqs=1)
    ex = _fake_executor(kv)
    torch.manual_seed(0)
    for name in ex.caches:
        ex.caches[name].normal_()
    ref = {k: v.clone() for k, v in ex.caches.items()}
    store = HostKVStore(ex)
    store.apply([HostCopy(SPILL, 0, 1, 11), HostCopy(SPILL, 0, 2, 12), HostCopy(SPILL, 1, 3, 13)])
    assert store.bytes_used == 2 * (2 * SWA.page_bytes) + C2.page_bytes
    for t in ex.caches.values():
        t.zero_()
    # block 4 restored twice in a row: the later copy wins, as if applied one by one
    store.apply([HostCopy(RESTORE, 0, 4, 11), HostCopy(RESTORE, 0, 4, 12), HostCopy(RESTORE, 0, 5, 11),
                 HostCopy(RESTORE, 1, 2, 13), HostCopy(DROP, 0, -1, 12)])
    for name in ("s0", "s1"):
        assert torch.equal(ex.caches[name][16:20], ref[name][8:12])  # block 4 <- key 12 (block 2)
        assert torch.equal(ex.caches[name][20:24], ref[name][4:8])  # block 5 <- key 11 (block 1)
    assert torch.equal(ex.caches["c0"][8:12], ref["c0"][12:16])  # C2: 4 entries per block
    assert (0, 12) not in store.entries and store.bytes_used == 2 * SWA.page_bytes + C2.page_bytes
