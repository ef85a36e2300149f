"""Chained steps (``ModelRunner.launch(next, prev=launched)``): under async scheduling on a platform whose
steps run on the worker (every accelerator), a simple step is launched behind the running one before that
one's tokens reach the host; its decode ids are read from the previous step's token tensor on the device.

The tokens, logprobs, positions and random streams must be exactly those of synchronous stepping, with
chaining used wherever the batch allows it and skipped for requests that need the host's token history
(penalties, grammar, min_tokens not yet reached, prompt logprobs)."""
from __future__ import annotations

import pytest

from deepinfer_core.platform.cpu import CpuPlatform
from deepinfer_core.sampling_params import SamplingParams
from tests.engine.conftest import make, random_prompt
from tests.engine.test_decode_graphs import GraphingCpu


class WorkerCpu(CpuPlatform):
    """The CPU platform with the accelerators' threading: steps run on the engine's worker thread."""

    steps_on_calling_thread = False


class WorkerGraphingCpu(GraphingCpu):
    """... and with decode steps replayed through the recording identity graph runner."""

    steps_on_calling_thread = False


PROMPTS = [random_prompt(n, 300 + n) for n in (5, 37, 90, 12, 61, 8)]


def sig(out):
    """Token ids and sorted (token, logprob) pairs per position (None without logprobs)."""
    o = out.outputs[0]
    return o.token_ids, None if o.logprobs is None else [sorted((k, v.logprob) for k, v in d.items())
                                                         for d in o.logprobs]


def _generate(d, params, platform=None, async_scheduling=True, reference=False, **kw):
    """Outputs and runner of one engine run. ``reference``: synchronous steps, every one through the runner's
    general path (``_execute_full``, host-side sampling), the oracle for the simple path's tokens."""
    llm = make(d, platform=platform, async_scheduling=async_scheduling, max_num_seqs=8, batch_invariant=True, **kw)
    if reference:
        llm.llm_engine.runner.is_simple = lambda so: False
    outs = [sig(o) for o in llm.generate(PROMPTS[:len(params)], params, use_tqdm=False)]
    return outs, llm.llm_engine.runner


def _plain_params():
    return [SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=2),
            SamplingParams(temperature=0.9, top_p=0.8, seed=11, max_tokens=13, ignore_eos=True, logprobs=1),
            SamplingParams(temperature=0.7, top_k=20, seed=5, max_tokens=6, ignore_eos=True),
            SamplingParams(temperature=0.0, max_tokens=15, ignore_eos=True),
            SamplingParams(temperature=1.0, seed=3, max_tokens=9, ignore_eos=True, logprobs=0)]


@pytest.mark.parametrize("graphs", [False, True])
def test_chained_steps_equal_synchronous_steps(tiny_v4_dir, graphs):
    params = _plain_params()
    want, _ = _generate(tiny_v4_dir, params, async_scheduling=False, reference=True)
    platform = WorkerGraphingCpu() if graphs else WorkerCpu()
    got, runner = _generate(tiny_v4_dir, params, platform=platform, enforce_eager=not graphs,
                            graph_capture_sizes=[1, 2, 4, 8])
    assert got == want
    assert _generate(tiny_v4_dir, params, async_scheduling=False)[0] == want  # simple steps, not chained
    # requests finish at different steps (max_tokens 6..15) and join late: most steps are chained
    assert runner.chained_steps >= 8
    if graphs:
        assert platform.recorder.layouts and runner.executor.graphs.steps > 0


def test_chained_logprobs_with_ranks_equal_synchronous_steps(tiny_v4_dir):
    """Every request asks for logprobs (one the whole vocabulary): the chained step gathers them on the
    device at launch, so ``finish`` reads host copies only; ids, logprobs and ranks equal the general path."""
    params = [SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True, logprobs=3),
              SamplingParams(temperature=0.8, seed=21, max_tokens=7, ignore_eos=True, logprobs=-1),
              SamplingParams(temperature=1.0, top_k=5, seed=4, max_tokens=11, ignore_eos=True, logprobs=0)]

    def ranked(d, **kw):
        llm = make(d, max_num_seqs=8, batch_invariant=True, **kw)
        outs = llm.generate(PROMPTS[:3], params, use_tqdm=False)
        return [[sorted((k, v.logprob, v.rank) for k, v in pos.items()) for pos in o.outputs[0].logprobs]
                for o in outs], llm.llm_engine.runner

    want, _ = ranked(tiny_v4_dir, async_scheduling=False)  # simple steps, not chained
    general = make(tiny_v4_dir, max_num_seqs=8, batch_invariant=True, async_scheduling=False)
    general.llm_engine.runner.is_simple = lambda so: False
    outs = general.generate(PROMPTS[:3], params, use_tqdm=False)
    assert want == [[sorted((k, v.logprob, v.rank) for k, v in pos.items()) for pos in o.outputs[0].logprobs]
                    for o in outs]
    got, runner = ranked(tiny_v4_dir, platform=WorkerCpu(), async_scheduling=True)
    assert got == want and runner.chained_steps >= 5
    vocab = len(want[1][0])
    assert vocab > 100 and all(len(pos) == vocab for pos in want[1])  # -1: the whole vocabulary, sampled token in it
    assert all(len(pos) == 1 for pos in want[2])  # logprobs=0: the sampled token alone


def test_the_accelerators_host_copies_carry_tokens_and_logprobs(tiny_v4_dir, monkeypatch):
    """The branch an accelerator takes at launch (tokens and gathered logprobs copied to host buffers, an event
    recorded after the copies; ``finish`` waits on it and reads the copies only), forced on the CPU: the
    copies are clones, the event a recorder. Outputs equal the general path, and every finish waited."""
    from deepinfer_core.engine import model_runner as mr

    class Event:
        made = waited = 0

        def __init__(self):
            Event.made += 1

        def synchronize(self):
            Event.waited += 1

    copies = []
    monkeypatch.setattr(mr, "_needs_host_copy", lambda t: True)
    monkeypatch.setattr(mr, "_to_pinned", lambda t: copies.append(t) or t.clone())
    monkeypatch.setattr(mr, "_recorded_event", lambda device: Event())
    params = _plain_params()
    want, _ = _generate(tiny_v4_dir, params, async_scheduling=False, reference=True)
    got, runner = _generate(tiny_v4_dir, params, platform=WorkerCpu())
    assert got == want and runner.chained_steps >= 8
    assert Event.made > 0 and Event.waited == Event.made  # every launched step's finish waited on its event
    assert sum(c.dim() == 2 for c in copies) >= 3  # the gathered logprob ids / values went through the copies


def test_requests_that_need_the_host_history_are_not_chained(tiny_v4_dir):
    """Penalties and a min_tokens not yet reached read the history of sampled tokens: a batch holding
    such a request runs its steps one after the other (same outputs), and chaining resumes when the
    batch no longer holds one."""
    params = [SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
              SamplingParams(temperature=0.8, seed=9, max_tokens=4, ignore_eos=True, repetition_penalty=1.3,
                             presence_penalty=0.5),
              SamplingParams(temperature=0.0, max_tokens=12, min_tokens=3)]
    want, _ = _generate(tiny_v4_dir, params, async_scheduling=False, reference=True)
    got, runner = _generate(tiny_v4_dir, params, platform=WorkerCpu())
    assert got == want
    assert 0 < runner.chained_steps < 11  # not while the penalised request runs; again after it finished


def test_a_bad_request_next_to_chained_steps_is_named_and_the_others_finish(tiny_v4_dir):
    """A request rejected at add time never reaches the runner; the batch around it still chains."""
    llm = make(tiny_v4_dir, platform=WorkerCpu(), async_scheduling=True, max_num_seqs=8)
    with pytest.raises(ValueError, match="temperature"):
        llm.generate([PROMPTS[0]], SamplingParams(temperature=-1.0), use_tqdm=False)
    outs = llm.generate(PROMPTS[:3], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outs] == [8, 8, 8]
    assert llm.llm_engine.runner.chained_steps > 0


def test_chain_steps_off_finishes_every_step_first(tiny_v4_dir):
    params = _plain_params()[:3]
    want, _ = _generate(tiny_v4_dir, params, async_scheduling=False, reference=True)
    got, runner = _generate(tiny_v4_dir, params, platform=WorkerCpu(), chain_steps=False)
    assert got == want and runner.chained_steps == 0
    with pytest.raises(ValueError, match="chain_steps must be True or False"):
        make(tiny_v4_dir, chain_steps="yes")
