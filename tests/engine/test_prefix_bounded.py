"""Bounded prefix replay (``prefix_replay="bounded"``) and V4.1 decoder-side replay.

Two kinds of checks. Exactness of the mechanism: with a replay window covering the model's whole
receptive field (layers x window) every floored window only cuts rows whose influence cannot reach
the hit, so a bounded hit must be bit-identical to a cold run; that pins down tables, floors,
suppressed compressed writes and rebuilt per-request state, under eviction and preemption too.
Approximation: with the real window the result is close to, not equal to, a cold run; the measured
deviation is asserted against the tolerance documented in docs/prefix_caching.md.
"""
from __future__ import annotations

import pytest
import torch

from deepinfer_core import SamplingParams
from deepinfer_core.config import EngineConfig
from deepinfer_core.kv.block_pool import NULL_BLOCK_ID
from deepinfer_core.kv.manager import KVCacheManager
from deepinfer_core.kv.spec import CompressedSpec, SlidingWindowSpec
from deepinfer_core.request import Request
from deepinfer_core.runner.context import SeqSlice, build_step_context
from tests.engine.conftest import make, random_prompt, sig

SYSTEM = random_prompt(300, 4242)
QUESTIONS = [random_prompt(10 + 5 * i, 800 + i) for i in range(12)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=2)
SEEDED = SamplingParams(temperature=0.9, seed=11, max_tokens=8, ignore_eos=True, logprobs=2)
# Receptive field of the tiny checkpoints: layers x (window - 1) rows, rounded up (V4: 4 layers,
# V4.1: 10, window 16). A replay this long is exact.
FULL_FIELD = {"v4": 64, "v41": 160}
# Measured on these prompts (docs/prefix_caching.md): max |logit - cold logit| of the first token.
TOLERANCE = {"v4": 0.5, "v41": 2.0}


@pytest.fixture(scope="module")
def dirs(tiny_v4_dir, tmp_path_factory):
    from deepinfer_models.testing import write_tiny_v41_checkpoint

    d = tmp_path_factory.mktemp("bounded_v41")
    write_tiny_v41_checkpoint(d, quant="fp8", seed=5)
    return {"v4": tiny_v4_dir, "v41": d}


@pytest.fixture(scope="module")
def cold(dirs):
    """Per family: signatures of every (question, params) run alone without caching."""
    out = {}
    for fam, d in dirs.items():
        llm = make(d, enable_prefix_caching=False)
        out[fam] = [[sig(llm.generate([SYSTEM + q], sp, use_tqdm=False)[0]) for sp in (GREEDY, SEEDED)]
                    for q in QUESTIONS[:4]]
    return out


def first_logits(llm, prompts):
    """fp32 logits [len(prompts), V] of each prompt's first output token, one request at a time."""
    model = llm.llm_engine.model
    got, orig = [], model.compute_logits
    model.compute_logits = lambda h: got.append(orig(h)) or got[-1]
    rows = []
    for p in prompts:
        got.clear()
        llm.generate([p], SamplingParams(temperature=0.0, max_tokens=1), use_tqdm=False)
        rows.append(got[0][-1].clone())
    model.compute_logits = orig
    return torch.stack(rows)


# -- the mechanism is exact when the replay covers the receptive field ----------------------------
@pytest.mark.parametrize("fam", ["v4", "v41"])
def test_full_field_bounded_replay_is_bit_identical(dirs, cold, fam):
    llm = make(dirs[fam], prefix_replay="bounded", decoder_replay=False, prefix_replay_window=FULL_FIELD[fam])
    eng = llm.llm_engine
    llm.generate([SYSTEM], SamplingParams(max_tokens=1), use_tqdm=False)
    outs = llm.generate([SYSTEM + q for q in QUESTIONS[:4] for _ in range(2)], [GREEDY, SEEDED] * 4, use_tqdm=False)
    assert [sig(o) for o in outs] == [s for pair in cold[fam] for s in pair]
    assert eng.kv.num_hit_tokens >= 8 * (256 - FULL_FIELD[fam] - 3)
    assert eng.kv.num_free_blocks == eng.kv.num_usable_blocks


def test_eviction_and_preemption_under_a_tiny_pool_never_corrupt(dirs, cold):
    probe = make(dirs["v4"])
    per_block = sum(s.page_bytes for s in probe.llm_engine.executor.specs.values() if hasattr(s, "page_bytes"))
    llm = make(dirs["v4"], kv_cache_memory_bytes=per_block * 30, prefix_replay="bounded",
               prefix_replay_window=FULL_FIELD["v4"])
    eng = llm.llm_engine
    preempted = []
    orig = eng.scheduler._preempt
    eng.scheduler._preempt = lambda req, out: (preempted.append(req.request_id), orig(req, out))
    prompts = [SYSTEM + q for q in QUESTIONS[:4]] + [random_prompt(250, 90 + i) for i in range(4)]
    for rnd, sp in enumerate((GREEDY, SEEDED)):
        outs = llm.generate(prompts, sp, use_tqdm=False)  # all at once: the pool cannot hold them
        for k, out in enumerate(outs[:4]):
            assert sig(out) == cold["v4"][k][rnd]
    assert preempted, "the pool was meant to force preemption"
    assert eng.kv.pool.num_evictions > 0 and eng.kv.num_hit_tokens > 0
    assert eng.kv.num_free_blocks == eng.kv.num_usable_blocks


# -- with the real window: approximate, measured ---------------------------------------------------
@pytest.mark.parametrize("fam", ["v4", "v41"])
def test_bounded_hits_stay_within_the_measured_tolerance(dirs, fam):
    prompts = [SYSTEM + q for q in QUESTIONS]
    ref = first_logits(make(dirs[fam], enable_prefix_caching=False, async_scheduling=False), prompts)
    runs = {}
    for name, kw in {"exact": {}, "bounded": dict(prefix_replay="bounded")}.items():
        llm = make(dirs[fam], async_scheduling=False, **kw)
        llm.generate([SYSTEM], SamplingParams(max_tokens=1), use_tqdm=False)
        runs[name] = (first_logits(llm, prompts), llm.llm_engine)
    exact, bounded = runs["exact"][0], runs["bounded"][0]
    assert torch.equal(exact, ref)
    dev = (bounded - ref).abs().max(dim=-1).values
    print(f"{fam}: bounded max |dlogit| {dev.max():.4f}, median {dev.median():.4f}, argmax agreement "
          f"{int((bounded.argmax(-1) == ref.argmax(-1)).sum())}/{len(prompts)}")
    assert 0 < dev.max() <= TOLERANCE[fam]  # > 0: the sliding window really was rebuilt, not cached
    assert (bounded.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.6
    eng = runs["bounded"][1]
    w = eng.kv.replay_window
    assert eng.kv.num_hit_tokens == len(prompts) * (256 - w - eng.kv.history_tokens)
    # fewer cached block ids: no sliding-window block is ever cached
    assert eng.prefix_cache_stats()["cached_blocks"] < runs["exact"][1].prefix_cache_stats()["cached_blocks"]
    assert eng.kv.num_free_blocks == eng.kv.num_usable_blocks


@pytest.mark.parametrize("fam,window", [("v4", 32), ("v41", 64)])
def test_longer_replay_window_converges_to_exact(dirs, fam, window):
    """prefix_replay_window: 2W (V4) / 4W (V4.1) already cover what matters of the receptive field."""
    prompts = [SYSTEM + q for q in QUESTIONS[:6]]
    ref = first_logits(make(dirs[fam], enable_prefix_caching=False, async_scheduling=False), prompts)
    llm = make(dirs[fam], async_scheduling=False, prefix_replay="bounded", decoder_replay=False,
               prefix_replay_window=window)
    llm.generate([SYSTEM], SamplingParams(max_tokens=1), use_tqdm=False)
    got = first_logits(llm, prompts)
    assert llm.llm_engine.kv.num_hit_tokens > 0
    assert (got - ref).abs().max() <= 1e-2  # measured: 0.006 (V4, 2W), < 1e-4 (V4.1, 4W)


def test_decoder_replay_trims_late_rows_and_keeps_prompt_logprob_requests_exact(dirs):
    d = dirs["v41"]
    prompts = [SYSTEM + q for q in QUESTIONS[:6]]
    ref = first_logits(make(d, enable_prefix_caching=False, async_scheduling=False), prompts)
    llm = make(d, enable_prefix_caching=False, decoder_replay=True, async_scheduling=False)
    model = llm.llm_engine.model
    assert model.replay_cut == 6  # the tiny flash topology's last kv source
    got = first_logits(llm, prompts)
    total, kept = model.replay_rows
    assert kept < total / 4  # prefill steps ran layers 6.. on 16 of ~300 rows
    dev = (got - ref).abs().max(dim=-1).values
    assert 0 < dev.max() <= TOLERANCE["v41"]
    # a request asking for prompt logprobs keeps every row: identical to the untrimmed model
    sp = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=2, prompt_logprobs=1)
    plain = make(d, enable_prefix_caching=False).generate([prompts[0]], sp, use_tqdm=False)[0]
    trimmed = make(d, enable_prefix_caching=False, decoder_replay=True).generate([prompts[0]], sp, use_tqdm=False)[0]
    assert sig(trimmed) == sig(plain)
    def prompt_lps(out):
        return [None if d is None else sorted((k, v.logprob) for k, v in d.items()) for d in out.prompt_logprobs]

    assert prompt_lps(trimmed) == prompt_lps(plain) and len(prompt_lps(plain)) == len(prompts[0])


def test_bounded_config_and_v4_has_no_decoder_replay(dirs):
    with pytest.raises(ValueError, match="prefix_replay"):
        EngineConfig(model="x", prefix_replay="approximate")
    assert EngineConfig(model="x", prefix_replay="bounded").use_decoder_replay
    assert not EngineConfig(model="x", prefix_replay="bounded", decoder_replay=False).use_decoder_replay
    with pytest.raises(ValueError, match="decoder_replay=True needs"):
        EngineConfig(model="x", decoder_replay=True)  # exact hits would read late-layer window KV never written
    assert make(dirs["v4"], prefix_replay="bounded").llm_engine.model.__class__.__name__ == "DeepseekV4ForCausalLM"


# -- units: the manager's bounded hit and the floored step metadata ---------------------------------
SWA = SlidingWindowSpec((4,), torch.float32, window=8, block_size=4)
C2 = CompressedSpec((6,), torch.float32, ratio=2, block_size=8)


def _done(kv, req, n):
    assert kv.allocate_slots(req, n)
    req.num_computed_tokens += n


@pytest.mark.parametrize("mode", ["exact", "bounded"])
def test_manager_bounded_hit_skips_sliding_groups(mode):
    kv = KVCacheManager([SWA, C2], [], num_blocks=40, max_num_seqs=4, enable_caching=True, replay_tokens=2,
                        replay_mode=mode, history_tokens=1)
    a = Request("a", list(range(24)), SamplingParams(max_tokens=4))
    _done(kv, a, 24)
    kv.free(a)
    cached = kv.pool.num_cached_blocks
    b = Request("b", list(range(24)) + [99, 98, 97], SamplingParams(max_tokens=4))
    h, r, tables = kv.find_prefix(b)
    assert h == 24
    if mode == "exact":
        assert (r, tables.window_floor, cached) == (2, 0, 6 + 3)
        assert tables[0][-1] != NULL_BLOCK_ID  # the sliding blocks come from the cache
        return
    # bounded: only the 3 compressed blocks are cached; replay = window + history, floor at h - window
    assert (r, tables.window_floor, cached) == (9, 16, 3)
    assert tables[0] == [NULL_BLOCK_ID] * ((24 - 9) // 4)
    # freed uncached blocks are reused before any cached one is evicted (vLLM's free-list order)
    kv = KVCacheManager([SWA, C2], [], num_blocks=20, max_num_seqs=4, enable_caching=True, replay_mode=mode)
    _done(kv, a := Request("a2", list(range(24)), SamplingParams(max_tokens=4)), 24)
    kv.free(a)  # 3 cached compressed blocks
    _done(kv, b := Request("b2", [5, 6, 7], SamplingParams(max_tokens=4)), 3)
    kv.free(b)  # 2 uncached blocks, freed after the cached ones
    _done(kv, Request("c2", list(range(100, 140)), SamplingParams(max_tokens=4)), 40)  # 15 of the 16 uncached
    assert kv.pool.num_evictions == 0 and kv.pool.num_cached_blocks == 3


def test_step_context_floors_windows_and_rebuilds_sliding_kv():
    specs = {0: SWA, 1: C2}
    tables = {0: [1, 2, 3, 4, 5], 1: [6, 7, 8]}
    # positions 12..19 of a hit at 16 whose windows are floored at 14 (bounded) or not (exact)
    floored = build_step_context([SeqSlice(12, 8, tables, 0, no_write_before=16, window_floor=14)], specs,
                                 {"s": 0, "c": 1}, {}, torch.device("cpu"))
    exact = build_step_context([SeqSlice(12, 8, tables, 0, no_write_before=16)], specs, {"s": 0, "c": 1}, {},
                               torch.device("cpu"))
    pos = floored.positions
    assert (floored.groups[0].write_slots >= 0).all()  # sliding KV of replayed tokens is rebuilt
    assert ((exact.groups[0].write_slots >= 0) == (pos >= 16)).all()
    for ctx in (floored, exact):  # compressed entries below the hit are never rewritten
        assert (ctx.groups[1].write_slots[pos < 16] == -1).all()
    read_pos = pos[:, None] - torch.arange(7, -1, -1)[None, :]
    assert ((floored.groups[0].read_idx >= 0) == (read_pos >= 14)).all()
    assert ((exact.groups[0].read_idx >= 0) == (read_pos >= 0)).all()


def test_bounded_hits_under_speculative_decoding_are_lossless(dirs):
    """DSpark on bounded hits: the draft's window KV is rebuilt by the replay like the target's; greedy
    outputs equal bounded mode without drafts (forward_with_taps never trims, so compare without
    decoder replay)."""
    d = dirs["v41"]
    sp = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    prompts = [SYSTEM + q for q in QUESTIONS[:3]]
    outs = {}
    for name, kw in {"plain": {}, "spec": dict(speculative_config={"num_speculative_tokens": 3})}.items():
        llm = make(d, prefix_replay="bounded", decoder_replay=False, **kw)
        llm.generate([SYSTEM], SamplingParams(max_tokens=1), use_tqdm=False)
        outs[name] = [o.outputs[0].token_ids for o in llm.generate(prompts, sp, use_tqdm=False)]
        assert llm.llm_engine.kv.num_hit_tokens > 0
        assert llm.llm_engine.kv.num_free_blocks == llm.llm_engine.kv.num_usable_blocks
    assert outs["spec"] == outs["plain"]
