"""Chained engine steps on the H200 (not run in CI): a simple decode step is launched behind the running one
before that one's tokens reach the host (``ModelRunner.launch(next, prev=launched)``).

- outputs equal the runner's general path run step by step (greedy and seeded sampling, logprobs), with
  decode graphs on;
- a chained launch never waits for the device: with every graph already captured, no host synchronisation
  happens inside ``_launch_simple`` of a chained step, nor in ``finish`` of a step that had one chained
  behind it, with and without logprobs (``torch.cuda.set_sync_debug_mode``; ``finish`` waits on its own
  event only).

    python3 -m pytest -q deepinfer_nvidia/tests/test_chained_cuda.py
"""
from __future__ import annotations

import traceback
import warnings

import pytest
import torch

from deepinfer_core import LLM, SamplingParams
from deepinfer_models.testing import write_tiny_v4_checkpoint

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("chained_v4")
    write_tiny_v4_checkpoint(d, quant="fp4", seed=4)  # MXFP4 experts: capturable
    return d


def _llm(ckpt, **kw):
    from deepinfer_nvidia.platform import NvidiaPlatform

    return LLM(str(ckpt), dtype="bfloat16", max_model_len=512, max_num_seqs=8, kv_cache_memory_bytes=1 << 30,
               max_num_batched_tokens=4096, platform=NvidiaPlatform(), graph_capture_sizes=[1, 2, 4, 8], **kw)


def _sig(outs):
    return [(list(o.outputs[0].token_ids), None if o.outputs[0].logprobs is None else
             [sorted((k, v.logprob) for k, v in d.items()) for d in o.outputs[0].logprobs]) for o in outs]


def test_chained_steps_match_the_general_path(ckpt):
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 1000, (n,), generator=g).tolist() for n in (5, 40, 90, 13, 70, 9)]
    params = [SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, logprobs=2),
              SamplingParams(temperature=0.9, top_p=0.8, seed=11, max_tokens=14, ignore_eos=True),
              SamplingParams(temperature=0.7, top_k=20, seed=5, max_tokens=9, ignore_eos=True, logprobs=1)] * 2
    ref = _llm(ckpt, batch_invariant=True, async_scheduling=False)
    ref.llm_engine.runner.is_simple = lambda so: False  # every step through the host-side sampling path
    want = _sig(ref.generate(prompts, params, use_tqdm=False))
    del ref
    llm = _llm(ckpt, batch_invariant=True)
    got = _sig(llm.generate(prompts, params, use_tqdm=False))
    assert got == want
    assert llm.llm_engine.runner.chained_steps >= 10 and llm.llm_engine.executor.graphs.steps > 0


@pytest.mark.parametrize("logprobs", [None, 3])
def test_a_chained_launch_never_waits_for_the_device(ckpt, logprobs):
    llm = _llm(ckpt)
    runner = llm.llm_engine.runner
    prompts = [[7 + i] * 24 for i in range(4)]
    params = SamplingParams(temperature=0.8, seed=3, max_tokens=16, ignore_eos=True, logprobs=logprobs)
    llm.generate(prompts, params, use_tqdm=False)  # captures the graphs these steps use
    real_launch, real_finish = runner._launch_simple, runner.finish
    syncs: list[str] = []
    chained_behind: set[int] = set()  # ids of launched steps that had a step launched behind them

    def audit(fn, *args):
        def hook(message, category, filename, lineno, file=None, line=None):
            # (set_sync_debug_mode itself warns that the mode is a prototype: not a sync)
            if "synchronizing CUDA operation" in str(message):  # where from: the innermost repository frames
                stack = [f for f in traceback.extract_stack()[:-1] if "/deepinfer_" in f.filename]
                syncs.append(f"{fn.__name__}: {filename}:{lineno} <- " + " <- ".join(
                    f"{f.filename.split('/work/main/')[-1]}:{f.lineno}" for f in stack[::-1][:4]))

        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = hook
            torch.cuda.set_sync_debug_mode("warn")
            try:
                return fn(*args)
            finally:
                torch.cuda.set_sync_debug_mode("default")

    def launch(so, prev):
        if prev is None or prev.result is not None:
            return real_launch(so, prev)
        chained_behind.add(id(prev))
        return audit(real_launch, so, prev)

    def finish(launched):
        if id(launched) not in chained_behind:
            return real_finish(launched)
        if launched.ready is not None:  # the one wait finish may make: on its own event, outside the audit
            launched.ready.synchronize()
            launched.ready = None
        return audit(real_finish, launched)

    runner._launch_simple, runner.finish = launch, finish
    c0 = runner.chained_steps
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert runner.chained_steps - c0 >= 10
    assert llm.llm_engine.executor.graphs.disabled_reason is None
    assert not syncs, f"host syncs inside chained launches or their predecessors' finish: {sorted(set(syncs))}"
    if logprobs is not None:
        assert all(len(pos) >= 1 for o in outs for pos in o.outputs[0].logprobs)
