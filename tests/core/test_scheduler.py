"""Scheduler: FCFS continuous batching, chunked prefill, preemption, stop rules, async == sync.

No model: ``FakeRunner`` plays the device. It writes each fed token into a paged
"KV cache" addressed through the step's block tables, keeps a per-slot state
counter, and samples the next token as a hash of what it *reads back through the
tables* (the sliding window of every sliding group, the whole history of every
compressed group). Any block freed too early, shared by two requests, read from
the null block, or any wrong token id fed after a preemption changes the output,
so comparing with ``reference`` (plain generation on the true sequence) checks the
whole bookkeeping end to end.
"""
from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from deepinfer_core.kv.manager import KVCacheManager
from deepinfer_core.kv.spec import CompressedSpec, SlidingWindowSpec, StateSpec
from deepinfer_core.request import PLACEHOLDER_TOKEN_ID, Request, RequestStatus
from deepinfer_core.sched_output import SchedulerOutput
from deepinfer_core.scheduler import Scheduler, SchedulerConfig

SWA = SlidingWindowSpec((1,), torch.float32, window=8, block_size=4)
C2 = CompressedSpec((1,), torch.float32, ratio=2, block_size=8)
STATE = StateSpec((2,), torch.float32)
VOCAB = 50
EOS = 7


def params(max_tokens=8, min_tokens=0, ignore_eos=False, stop_token_ids=()):
    return SimpleNamespace(max_tokens=max_tokens, min_tokens=min_tokens, ignore_eos=ignore_eos, stop_token_ids=list(stop_token_ids))


def make(num_blocks=400, max_num_seqs=8, budget=32, chunked=True, threshold=0, max_model_len=None, specs=(SWA, C2)):
    kv = KVCacheManager(list(specs), [STATE], num_blocks, max_num_seqs)
    return Scheduler(SchedulerConfig(max_num_seqs, budget, chunked, threshold, max_model_len), kv)


def _reads(specs, seq_or_reader, q):
    """What a query at position q reads in each group: its window, or everything (compressed)."""
    out = []
    for g, spec in enumerate(specs):
        lo = max(0, q - spec.window + 1) if isinstance(spec, SlidingWindowSpec) else 0
        out.append(tuple(seq_or_reader(g, p) for p in range(lo, q + 1)))
    return tuple(out)


def _next_token(reads) -> int:
    return hash(reads) % VOCAB  # ints and tuples hash deterministically


def reference(req: Request, specs, max_model_len=None) -> tuple[list[int], RequestStatus]:
    """Generation of one request alone on its true sequence, with the scheduler's stop rules."""
    seq, out = list(req.prompt_token_ids), []
    while True:
        tok = _next_token(_reads(specs, lambda g, p: seq[p], len(seq) - 1))
        seq.append(tok)
        out.append(tok)
        if len(out) >= req.min_tokens and ((not req.ignore_eos and tok in req.eos_token_ids) or tok in req.stop_token_ids):
            return out, RequestStatus.FINISHED_STOPPED
        if (req.max_tokens is not None and len(out) >= req.max_tokens) or (max_model_len and len(seq) >= max_model_len):
            return out, RequestStatus.FINISHED_LENGTH


class FakeRunner:
    """The device: paged cache through block tables, state slots, last sampled token per request."""

    def __init__(self, specs, expected_seqs=None):
        self.specs = list(specs)
        self.cache = [dict() for _ in self.specs]  # (block, offset) -> (req_id, position, token)
        self.state: dict[int, tuple[str, int]] = {}  # slot -> (owner, tokens fed)
        self.last_sampled: dict[str, int] = {}
        self.expected = expected_seqs or {}
        self.num_placeholders = 0

    def execute(self, out: SchedulerOutput) -> dict[str, list[int]]:
        sampled = {}
        for e in out.scheduled:
            rid, c, n = e.req_id, e.num_computed_tokens, e.num_scheduled_tokens
            toks = list(e.token_ids)
            assert len(toks) == n
            if PLACEHOLDER_TOKEN_ID in toks:
                assert toks == [PLACEHOLDER_TOKEN_ID] and not e.is_prefill
                toks = [self.last_sampled[rid]]
                self.num_placeholders += 1
            if c == 0:
                self.state[e.state_slot] = (rid, 0)
            assert self.state[e.state_slot] == (rid, c), "state slot shared or not continuous"
            self.state[e.state_slot] = (rid, c + n)
            for j, t in enumerate(toks):
                if rid in self.expected:
                    assert self.expected[rid][c + j] == t, f"{rid} fed a wrong token at position {c + j}"
                for g, spec in enumerate(self.specs):
                    blk = e.block_tables[g][(c + j) // spec.block_size]
                    assert blk != 0, "writing into the null block"
                    self.cache[g][(blk, (c + j) % spec.block_size)] = (rid, c + j, t)
            if e.samples:

                def read(g, p, e=e):
                    spec = self.specs[g]
                    blk = e.block_tables[g][p // spec.block_size]
                    assert blk != 0, f"{e.req_id} reads position {p} from the null block"
                    owner, pos, tok = self.cache[g][(blk, p % spec.block_size)]
                    assert (owner, pos) == (e.req_id, p), f"{e.req_id} reads position {p} overwritten by {owner}"
                    return tok

                tok = _next_token(_reads(self.specs, read, c + n - 1))
                sampled[rid] = [tok]
                self.last_sampled[rid] = tok
        return sampled


def check_invariants(sched: Scheduler, out: SchedulerOutput) -> None:
    kv = sched.kv
    held = []
    for req in sched.requests.values():
        assert kv.has_request(req.request_id) == (req.status is RequestStatus.RUNNING)
        held += [b for t in kv.get_block_tables(req).values() for b in t if b]
    assert len(held) == len(set(held)), "a block is owned twice"
    assert len(held) + kv.num_free_blocks == kv.num_usable_blocks, "pool accounting broken"
    assert len(sched.running) <= sched.config.max_num_seqs
    slots = [kv.state_slot(r) for r in sched.running]
    assert len(slots) == len(set(slots))
    assert out.total_num_scheduled_tokens <= sched.config.max_num_batched_tokens
    assert len({e.req_id for e in out.scheduled}) == len(out.scheduled)


def drive(sched, runner, arrivals, async_=False, aborts=None, max_steps=5000):
    """Run to completion. arrivals: list of (step, Request); aborts: step -> [req ids].

    Sync: schedule, execute, update. Async: schedule step N+1 (and execute it, the
    device runs in order) before the update of step N arrives.
    """
    arrivals = sorted(arrivals, key=lambda a: a[0])
    aborts = dict(aborts or {})
    results: dict[str, tuple[list[int], RequestStatus]] = {}
    outs = []
    prev = None
    step = 0

    def collect(reqs):
        for r in reqs:
            if r.is_finished:
                results[r.request_id] = (list(r.output_token_ids), r.status)

    while True:
        while arrivals and arrivals[0][0] <= step:
            sched.add_request(arrivals.pop(0)[1])
        out = None
        if sched.has_unfinished():
            out = sched.schedule()
            check_invariants(sched, out)
            outs.append(out)
            sampled = runner.execute(out)
        if async_:
            if prev is not None:
                collect(sched.update_from_output(*prev))
            prev = (out, sampled) if out is not None else None
        elif out is not None:
            assert not out.is_empty, "sync mode must always make progress"
            collect(sched.update_from_output(out, sampled))
        for rid in aborts.pop(step, []):
            req = sched.get_request(rid)
            if sched.abort_request(rid):
                results[rid] = (list(req.output_token_ids), RequestStatus.FINISHED_ABORTED)
        if out is None and prev is None and not arrivals:
            break
        step += 1
        assert step < max_steps, "no progress"
    assert not sched.has_unfinished()
    assert sched.kv.num_free_blocks == sched.kv.num_usable_blocks
    assert sched.kv.num_free_state_slots == sched.kv.max_num_seqs
    return results, outs


def _req(rid, n_prompt, seed=0, arrival=0.0, eos=None, **kw):
    rng = random.Random(f"{rid}-{seed}")
    return Request(rid, [rng.randrange(VOCAB) for _ in range(n_prompt)], params(**kw), arrival, eos)


def _sizes(out):
    return [(e.req_id, e.num_scheduled_tokens) for e in out.scheduled]


# -- batching shape ------------------------------------------------------------------
def test_fcfs_token_budget_and_chunk_sizes():
    sched = make(budget=16)
    reqs = [_req(f"r{i}", 10, max_tokens=3) for i in range(3)]
    _, outs = drive(sched, FakeRunner(sched.kv.group_specs), [(0, r) for r in reqs])
    assert _sizes(outs[0]) == [("r0", 10), ("r1", 6)]
    assert _sizes(outs[1]) == [("r0", 1), ("r1", 4), ("r2", 10)]
    assert _sizes(outs[2]) == [("r0", 1), ("r1", 1), ("r2", 1)]
    assert [e.samples for e in outs[0].scheduled] == [True, False]
    assert [e.is_prefill for e in outs[1].scheduled] == [False, True, True]


def test_chunked_prefill_of_a_long_prompt():
    sched = make(budget=16)
    r = _req("long", 40, max_tokens=2)
    _, outs = drive(sched, FakeRunner(sched.kv.group_specs), [(0, r)])
    chunks = [o.scheduled[0] for o in outs]
    assert [(e.num_computed_tokens, e.num_scheduled_tokens) for e in chunks] == [(0, 16), (16, 16), (32, 8), (40, 1)]
    assert [e.samples for e in chunks] == [False, False, True, True]
    assert [e.is_prefill for e in chunks] == [True, True, True, False]
    assert chunks[1].token_ids == r.prompt_token_ids[16:32]
    assert chunks[3].token_ids == [r.output_token_ids[0]]


def test_long_prefill_token_threshold_caps_chunks():
    sched = make(budget=16, threshold=5)
    reqs = [_req(f"r{i}", 12, max_tokens=1) for i in range(2)]
    _, outs = drive(sched, FakeRunner(sched.kv.group_specs), [(0, r) for r in reqs])
    assert [_sizes(o) for o in outs] == [[("r0", 5), ("r1", 5)], [("r0", 5), ("r1", 5)], [("r0", 2), ("r1", 2)]]


def test_chunked_prefill_off_waits_for_room():
    sched = make(budget=16, chunked=False)
    reqs = [_req("a", 10, max_tokens=2), _req("b", 10, max_tokens=2), _req("c", 3, max_tokens=2)]
    _, outs = drive(sched, FakeRunner(sched.kv.group_specs), [(0, r) for r in reqs])
    # b does not fit the 6 tokens left and is not split; c may not jump the queue (strict FCFS).
    assert _sizes(outs[0]) == [("a", 10)]
    assert _sizes(outs[1]) == [("a", 1), ("b", 10), ("c", 3)]
    with pytest.raises(ValueError, match="more than max_num_batched_tokens=16, and chunked prefill is off"):
        sched.add_request(_req("d", 17))


def test_max_num_seqs_limits_running():
    sched = make(max_num_seqs=2, budget=64)
    reqs = [_req(f"r{i}", 4, max_tokens=3 + i) for i in range(4)]
    _, outs = drive(sched, FakeRunner(sched.kv.group_specs), [(0, r) for r in reqs])
    assert all(len(o.scheduled) <= 2 for o in outs)
    assert _sizes(outs[0]) == [("r0", 4), ("r1", 4)]
    assert _sizes(outs[3]) == [("r1", 1), ("r2", 4)]  # r2 admitted right after r0 finished


# -- stop rules ------------------------------------------------------------------------
def _scripted(sched, req, script):
    """Feed scripted sampled tokens (sync) until the request finishes; returns it."""
    sched.add_request(req)
    while sched.has_unfinished():
        out = sched.schedule()
        sampled = {e.req_id: [script[req.num_output_tokens]] for e in out.scheduled if e.samples}
        sched.update_from_output(out, sampled)
    return req


@pytest.mark.parametrize(
    "kw, eos, script, n_out, status",
    [
        (dict(max_tokens=3), EOS, [1, 2, 3, 4], 3, RequestStatus.FINISHED_LENGTH),
        (dict(max_tokens=9), EOS, [1, EOS, 3], 2, RequestStatus.FINISHED_STOPPED),
        (dict(max_tokens=4, ignore_eos=True), EOS, [EOS, EOS, EOS, EOS, EOS], 4, RequestStatus.FINISHED_LENGTH),
        (dict(max_tokens=9, stop_token_ids=[42]), EOS, [1, 42, 3], 2, RequestStatus.FINISHED_STOPPED),
        (dict(max_tokens=9, min_tokens=3), EOS, [EOS, 42, 5, EOS, 1], 4, RequestStatus.FINISHED_STOPPED),
        (dict(max_tokens=9, min_tokens=2, stop_token_ids=[42]), [EOS, 8], [42, 8, 1], 2, RequestStatus.FINISHED_STOPPED),
        (dict(max_tokens=9), None, [EOS] * 9, 9, RequestStatus.FINISHED_LENGTH),
    ],
)
def test_stop_conditions(kw, eos, script, n_out, status):
    sched = make()
    req = _scripted(sched, _req("r", 5, eos=eos, **kw), script)
    assert req.status is status and req.output_token_ids == script[:n_out]
    if status is RequestStatus.FINISHED_STOPPED:
        assert req.stop_reason == script[n_out - 1] and status.finish_reason == "stop"
    assert sched.kv.num_free_blocks == sched.kv.num_usable_blocks


def test_max_model_len_and_caller_stop():
    sched = make(max_model_len=8)
    req = _scripted(sched, _req("r", 5, max_tokens=None), list(range(10)))
    assert req.status is RequestStatus.FINISHED_LENGTH and req.num_tokens == 8
    with pytest.raises(ValueError, match="max_model_len is 8"):
        sched.add_request(_req("long", 8))

    r2 = _req("s", 5)
    sched.add_request(r2)
    out = sched.schedule()
    sched.update_from_output(out, {"s": [3]})
    assert sched.finish_request("s", RequestStatus.FINISHED_STOPPED)  # a stop string matched
    assert not sched.finish_request("s", RequestStatus.FINISHED_STOPPED)
    assert r2.status is RequestStatus.FINISHED_STOPPED and sched.kv.num_free_blocks == sched.kv.num_usable_blocks
    assert sched.schedule().finished_req_ids == ["s"]
    with pytest.raises(ValueError, match="FINISHED_"):
        sched.finish_request("x", RequestStatus.RUNNING)


# -- preemption, abort, failure ----------------------------------------------------------
def test_preemption_under_a_tiny_pool_loses_nothing():
    specs = (SWA, C2)
    reqs = [_req(f"r{i}", 6 + 3 * i, seed=1, max_tokens=14, eos=None) for i in range(5)]
    expected = {r.request_id: reference(r, specs) for r in reqs}
    seqs = {r.request_id: r.prompt_token_ids + expected[r.request_id][0] for r in reqs}
    sched = make(num_blocks=16, budget=32, specs=specs)
    results, outs = drive(sched, FakeRunner(specs, seqs), [(0, r) for r in reqs])
    assert results == expected
    preempted = [rid for o in outs for rid in o.preempted_req_ids]
    assert preempted, "the pool was meant to be too small for all requests at once"
    # A preempted request resumes from position 0 with its prompt and the outputs it already had.
    victim = preempted[0]
    resume = next(
        e for o in outs[outs.index(next(o for o in outs if victim in o.preempted_req_ids)) + 1 :]
        for e in o.scheduled if e.req_id == victim
    )
    assert resume.num_computed_tokens == 0 and resume.token_ids == seqs[victim][: resume.num_scheduled_tokens]
    assert max(r.num_preemptions for r in reqs) >= 1


def _sync_step(sched, runner):
    out = sched.schedule()
    sched.update_from_output(out, runner.execute(out))
    return out


@pytest.mark.parametrize("state", ["waiting", "prefill", "decode", "preempted", "in_flight", "stale_preempted"])
def test_abort_in_every_state_frees_everything(state):
    specs = (C2,)
    tight = state in ("preempted", "stale_preempted")
    sched = make(num_blocks=5 if tight else 12, budget=32 if tight else 16, max_num_seqs=3, specs=specs)
    runner = FakeRunner(specs)  # C2 blocks hold 8 tokens; a tight pool has 4 usable blocks
    a, b = _req("a", 12, max_tokens=10), _req("b", 16 if state != "prefill" else 30, max_tokens=10)
    sched.add_request(a)
    sched.add_request(b)
    pending = []
    if state == "waiting":
        assert b.status is RequestStatus.WAITING
    elif state == "prefill":
        _sync_step(sched, runner)  # a: 12 tokens, b: first 4-token chunk
        assert b.status is RequestStatus.RUNNING and 0 < b.num_computed_tokens < b.num_prompt_tokens
    elif state in ("decode", "in_flight"):
        for _ in range(3):  # a 12, b 4 | a 1, b 12 (b samples) | a 1, b 1
            _sync_step(sched, runner)
        assert b.num_output_tokens == 2
        if state == "in_flight":
            out = sched.schedule()
            pending.append((out, runner.execute(out)))
            out = sched.schedule()  # async: b's next decode planned before the last one reported
            pending.append((out, runner.execute(out)))
            assert b.num_output_placeholders == 2 and b.num_inflight_tokens == 2
    elif state in ("preempted", "stale_preempted"):
        out = sched.schedule()  # a 12, b 16 tokens: the pool is full (2 + 2 blocks)
        if state == "preempted":
            sched.update_from_output(out, runner.execute(out))
        else:
            pending.append((out, runner.execute(out)))  # b's prefill has not reported yet
        out = sched.schedule()  # b's next token needs a third block: b, the last, yields
        pending.append((out, runner.execute(out)))
        assert out.preempted_req_ids == ["b"] and b.status is RequestStatus.PREEMPTED
        assert b.num_computed_tokens == 0 and b.num_output_placeholders == (1 if state == "stale_preempted" else 0)
    assert sched.abort_request("b")
    assert b.status is RequestStatus.FINISHED_ABORTED and not sched.kv.has_request("b")
    for out, sampled in pending:  # late outputs for the aborted request are ignored
        sched.update_from_output(out, sampled)
    assert b.status is RequestStatus.FINISHED_ABORTED
    assert sched.schedule().finished_req_ids[-1:] == ["b"] or state != "waiting"
    sched.abort_request("a")
    assert sched.kv.num_free_blocks == sched.kv.num_usable_blocks
    assert sched.kv.num_free_state_slots == sched.kv.max_num_seqs
    assert not sched.has_unfinished()
    assert not sched.abort_request("b") and not sched.abort_request("nope")


def test_request_that_can_never_fit_is_rejected():
    sched = make(num_blocks=6, specs=(SWA, C2))  # 5 usable blocks
    with pytest.raises(ValueError, match="needs 8 KV blocks at once even alone, but the pool has 5"):
        sched.add_request(_req("big", 30, max_tokens=10))  # feeding position 38: C2 5 blocks + SWA 3
    sched.add_request(_req("ok", 10, max_tokens=4))  # position 12: C2 2 + SWA 3 blocks
    off = make(num_blocks=6, chunked=False, budget=64, specs=(SWA,))
    with pytest.raises(ValueError, match="needs 8 KV blocks"):
        off.add_request(_req("whole", 30, max_tokens=1))  # an unsplit 30-token prompt spans 8 SWA blocks


def test_lone_request_gets_the_largest_chunk_that_fits():
    specs = (SWA,)
    sched = make(num_blocks=7, budget=64, specs=specs)  # 6 usable: 24 tokens of window blocks
    r = _req("r", 60, max_tokens=3)
    expected = reference(r, specs)
    results, outs = drive(sched, FakeRunner(specs), [(0, r)])
    assert results == {"r": expected}
    first = outs[0].scheduled[0]
    assert first.num_scheduled_tokens == 24 and not first.samples


def test_update_rejects_bad_runner_output():
    sched = make()
    sched.add_request(_req("a", 4))
    sched.add_request(_req("b", 40, max_tokens=2))
    o1 = sched.schedule()
    o2 = sched.schedule()
    with pytest.raises(ValueError, match="got step 1, expected step 0"):
        sched.update_from_output(o2, {})
    with pytest.raises(ValueError, match="did not sample"):
        sched.update_from_output(o1, {"a": [1], "b": [2]})
    with pytest.raises(ValueError, match="no sampled token for request 'a'"):
        sched.update_from_output(o1, {})
    with pytest.raises(ValueError, match="expected 1..1 sampled tokens"):
        sched.update_from_output(o1, {"a": [1, 2]})
    with pytest.raises(ValueError, match="non-negative int"):
        sched.update_from_output(o1, {"a": [-1]})
    sched.update_from_output(o1, {"a": [1]})
    with pytest.raises(ValueError, match="already queued"):
        sched.add_request(_req("a", 4))
    b = sched.get_request("b")
    sched.abort_request("b")
    with pytest.raises(ValueError, match="not fresh"):
        sched.add_request(b)
    with pytest.raises(ValueError, match="max_num_seqs 9 exceeds"):
        Scheduler(SchedulerConfig(max_num_seqs=9), sched.kv)
    with pytest.raises(ValueError, match="max_num_batched_tokens must be an int >= 1"):
        SchedulerConfig(max_num_batched_tokens=0)


def test_unbounded_request_fails_cleanly_when_the_pool_runs_out():
    sched = make(num_blocks=4, specs=(C2,))  # 3 usable blocks: 24 positions of compressed KV
    r = _req("r", 4, max_tokens=None)
    sched.add_request(r)
    reported = []
    for _ in range(100):
        out = sched.schedule()
        reported += sched.update_from_output(out, {e.req_id: [1] for e in out.scheduled if e.samples})
        if not sched.has_unfinished():
            break
    assert r.status is RequestStatus.FINISHED_ERROR and reported[-1] is r
    assert r.num_output_tokens == 21  # positions 0..23 were fed; position 24 needs a 4th block
    assert "cannot make progress" in r.error and "pool of 3 usable blocks" in r.error
    assert out.finished_req_ids == ["r"] and out.is_empty
    assert sched.kv.num_free_blocks == 3


@pytest.mark.parametrize("async_", [False, True])
@pytest.mark.parametrize("specs, prompt", [((SWA,), 33), ((SWA,), 3), ((SWA, C2), 10)])
def test_lone_request_in_a_pool_of_exactly_its_peak(specs, prompt, async_):
    r = _req("r", prompt, max_tokens=60)
    peak = KVCacheManager(list(specs), [], 2, 1).peak_blocks_alone(prompt + 60 - 1, 1)
    sched = make(num_blocks=peak + 1, budget=8, specs=specs)
    results, _ = drive(sched, FakeRunner(specs), [(0, r)], async_=async_)
    assert results == {"r": reference(r, specs)}
    with pytest.raises(ValueError, match="even alone"):
        make(num_blocks=peak, budget=8, specs=specs).add_request(_req("r", prompt, max_tokens=60))


def test_async_never_schedules_past_max_tokens():
    sched = make()
    r = _req("r", 5, max_tokens=2)
    sched.add_request(r)
    outs = [sched.schedule() for _ in range(3)]  # no step has reported back yet
    assert [o.num_scheduled_tokens for o in outs] == [{"r": 5}, {"r": 1}, {}]
    assert outs[1].scheduled[0].token_ids == [PLACEHOLDER_TOKEN_ID]
    assert r.num_output_placeholders == 2 and r.num_computed_tokens == 6
    sched.update_from_output(outs[0], {"r": [11]})
    assert r.num_output_placeholders == 1 and r.num_processed_tokens == 5
    assert sched.update_from_output(outs[1], {"r": [12]}) == [r]
    assert sched.update_from_output(outs[2], {}) == []
    assert r.status is RequestStatus.FINISHED_LENGTH and r.output_token_ids == [11, 12]


def test_async_preempted_request_resumes_only_after_its_token_arrives():
    specs = (C2,)
    sched = make(num_blocks=5, budget=32, specs=specs)  # 4 usable blocks of 8 tokens
    runner = FakeRunner(specs)
    a, b = _req("a", 12, max_tokens=3), _req("b", 16, max_tokens=5)
    sched.add_request(a)
    sched.add_request(b)
    steps = []

    def plan():
        out = sched.schedule()
        steps.append((out, runner.execute(out)))
        return out

    plan()  # a 12 + b 16 tokens fill the pool
    assert plan().preempted_req_ids == ["b"]  # b's decode needs a third block
    assert b.num_output_placeholders == 1  # the token its prefill sampled is still in flight
    sched.abort_request("a")  # now the whole pool is free...
    assert plan().is_empty  # ...but b must wait for its own token before it re-prefills
    for out, sampled in steps:
        sched.update_from_output(out, sampled)
    assert b.output_token_ids == steps[0][1]["b"] and b.num_output_placeholders == 0
    out = sched.schedule()
    (e,) = out.scheduled
    assert (e.req_id, e.num_computed_tokens, e.token_ids) == ("b", 0, b.prompt_token_ids + steps[0][1]["b"])
    sched.update_from_output(out, runner.execute(out))
    drive(sched, runner, [])
    assert b.output_token_ids == reference(b, specs)[0]


# -- async == sync -----------------------------------------------------------------------
def _workload(seed, n, eos_every=True, spread=30):
    rng = random.Random(seed)
    arrivals = []
    for i in range(n):
        kw = dict(max_tokens=rng.randint(1, 20), min_tokens=rng.choice([0, 0, 2]), ignore_eos=rng.random() < 0.2)
        if rng.random() < 0.3:
            kw["stop_token_ids"] = [rng.randrange(VOCAB)]
        kw["min_tokens"] = min(kw["min_tokens"], kw["max_tokens"])
        r = _req(f"q{i}", rng.randint(1, 40), seed=seed, arrival=float(i), eos=EOS if eos_every else None, **kw)
        arrivals.append((rng.randint(0, spread), r))
    return arrivals


def _fresh(arrivals):
    return [
        (t, Request(r.request_id, r.prompt_token_ids, r.sampling_params, r.arrival, sorted(r.eos_token_ids))) for t, r in arrivals
    ]


@pytest.mark.parametrize("num_blocks", [400, 24])
def test_async_outputs_equal_sync(num_blocks):
    specs = (SWA, C2)
    arrivals = _workload(3, 16)
    expected = {r.request_id: reference(r, specs) for _, r in arrivals}
    got = {}
    for async_ in (False, True):
        sched = make(num_blocks=num_blocks, budget=24, max_num_seqs=6, specs=specs)
        runner = FakeRunner(specs)
        got[async_], _ = drive(sched, runner, _fresh(arrivals), async_=async_)
        if async_:
            assert runner.num_placeholders > 0  # decodes really ran ahead of their sampled tokens
    assert got[False] == got[True] == expected


# -- randomized stress ----------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(16))
def test_randomized_stress(seed):
    """Random arrivals, lengths, stop rules and aborts; seed bits pick async, chunking and a tight pool."""
    rng = random.Random(seed)
    specs = [(SWA, C2), (SWA,), (C2, SlidingWindowSpec((1,), torch.float32, window=5, block_size=2))][seed % 3]
    async_, chunked, tight = bool(seed & 1), not seed & 2, bool(seed & 4)
    budget = rng.choice([16, 40, 64])
    arrivals = _workload(100 + seed, 30, spread=4 if tight else 30)
    if not chunked:
        arrivals = [(t, r) for t, r in arrivals if r.num_prompt_tokens <= budget]
    # 15 usable blocks fit any single request of this workload (peak 15: a whole 40-token prompt, chunking off).
    num_blocks = 16 if tight else rng.choice([40, 300])
    sched = make(num_blocks=num_blocks, budget=budget, max_num_seqs=rng.choice([2, 5, 8]) if not tight else 8,
                 chunked=chunked, threshold=rng.choice([0, 0, 7]), specs=specs)
    expected = {r.request_id: reference(r, specs) for _, r in arrivals}
    aborted_ids = {r.request_id for _, r in rng.sample(arrivals, 6)}
    aborts = {}
    for rid in aborted_ids:
        aborts.setdefault(rng.randint(0, 60), []).append(rid)
    runner = FakeRunner(specs)
    results, outs = drive(sched, runner, arrivals, async_=async_, aborts=aborts)
    assert set(results) == set(expected)  # every request finished
    for rid, (toks, status) in results.items():
        exp_toks, exp_status = expected[rid]
        if status is RequestStatus.FINISHED_ABORTED:
            assert rid in aborted_ids and exp_toks[: len(toks)] == toks
        else:
            assert (toks, status) == (exp_toks, exp_status), rid
    if tight:
        assert any(o.preempted_req_ids for o in outs) or not chunked
    if async_:
        assert runner.num_placeholders > 0
