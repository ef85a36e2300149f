"""Decode steps padded to graph buckets (``runner/decode_graphs.py``) give the eager step's results.

The CPU has no graph API, so these tests hand the executor an identity "graph runner" that records the
signatures it is called with: what runs is exactly the function a CUDA graph would capture (the padded,
packed, static-shape step). In batch-invariant mode the padded step must be bit-identical to the eager
one and must not touch any cache row a real request owns; the engine must route decode steps through
it and give the same tokens and logprobs as ``enforce_eager=True``.
"""
from __future__ import annotations

import contextlib

import pytest
import torch

from deepinfer_core import LLM, SamplingParams
from deepinfer_core.kernels.mode import kernel_mode
from deepinfer_core.kv.spec import StateSpec
from deepinfer_core.platform.cpu import CpuPlatform
from deepinfer_core.platform.interface import PlatformCapabilities
from deepinfer_core.runner.executor import PagedExecutor
from deepinfer_core.runner.simple_driver import run_requests
from deepinfer_models.deepseek_v4.loading import load_deepseek_v4
from deepinfer_models.deepseek_v41.loading import load_deepseek_v41
from deepinfer_models.testing import write_tiny_v4_checkpoint
from tests.engine.conftest import random_prompt
from tests.models.v41_helpers import prompt, tiny_ckpt


class RecordingRunner:
    """An identity graph runner that records each call's layout (the graph signature). Like
    ``CudaGraphRunner``, the first call of a signature runs ``fn`` twice more before its result (the
    warm-ups before a capture, then the replay), so a step must be idempotent to pass these tests."""

    def __init__(self):
        self.layouts = []

    def __call__(self, fn):
        def run(*args, **kwargs):
            if kwargs["layout"] in self.layouts:  # a replay (runs no Python on a GPU)
                self.layouts.append(kwargs["layout"])
                return fn(*args, **kwargs)
            fn(*args, **kwargs)  # the two warm-ups, eager
            fn(*args, **kwargs)
            self.layouts.append(kwargs["layout"])
            with no_host_data_to_device():  # the capture
                return fn(*args, **kwargs)
        return run


@contextlib.contextmanager
def no_host_data_to_device():
    """Inside a captured function, ``torch.tensor(data, device=...)`` is a copy from pageable host
    memory, which CUDA graph capture refuses ("Cannot copy between CPU and CUDA tensors during CUDA
    graph capture"); the CPU cannot see that, so the identity runner refuses it by name."""
    real_tensor, real_as_tensor = torch.tensor, torch.as_tensor

    def guarded(real):
        def make(data, *args, **kwargs):
            if kwargs.get("device") is not None and not isinstance(data, torch.Tensor):
                raise AssertionError(f"host data copied to the device inside a captured step: {real.__name__}("
                                     f"{type(data).__name__}, device={kwargs['device']})")
            return real(data, *args, **kwargs)
        return make

    torch.tensor, torch.as_tensor = guarded(real_tensor), guarded(real_as_tensor)
    try:
        yield
    finally:
        torch.tensor, torch.as_tensor = real_tensor, real_as_tensor


def _load(arch, tmp_path, bi):
    with kernel_mode(batch_invariant=bi):
        if arch == "v4":
            return load_deepseek_v4(write_tiny_v4_checkpoint(tmp_path / "v4", quant="fp8", seed=3),
                                    dtype=torch.float32)
        return load_deepseek_v41(tiny_ckpt("mixed", "fp4"), dtype=torch.float32)


def _steps(lens):
    """Prefill every request, 4 decode steps of all of them, then 4 of the first len-1 (another bucket)."""
    n = len(lens)
    return ([[(i, k) for i, k in enumerate(lens)]] + [[(i, 1) for i in range(n)] for _ in range(4)]
            + [[(i, 1) for i in range(n - 1)] for _ in range(4)])


def _run_both(model, lens, runner, min_context=None):
    """The requests of ``lens`` (``_steps``) through an eager executor and one with graph ``runner``:
    (eager executor, graphed executor, eager hidden states, graphed hidden states)."""
    reqs = [prompt(k + 8, seed=k) for k in lens]
    eager_ex = PagedExecutor(model, num_blocks=256, max_num_seqs=6)
    graph_ex = PagedExecutor(model, num_blocks=256, max_num_seqs=6, graph_runner=runner, graph_batch_sizes=(1, 2, 5),
                             max_context=512)
    if min_context is not None:
        graph_ex.graphs.min_context = min_context
    eager = run_requests(eager_ex, reqs, _steps(lens))
    graphed = run_requests(graph_ex, reqs, _steps(lens))
    return eager_ex, graph_ex, eager, graphed


def _compare(arch, tmp_path, bi):
    rec = RecordingRunner()
    # contexts cross the 256 bucket during decode
    eager_ex, graph_ex, eager, graphed = _run_both(_load(arch, tmp_path, bi), [1, 3, 5, 250], rec, min_context=16)
    return eager_ex, graph_ex, rec, eager, graphed


@pytest.mark.parametrize("arch", ["v4", "v41"])
def test_padded_decode_is_bit_identical_in_batch_invariant_mode(arch, tmp_path):
    eager_ex, graph_ex, rec, eager, graphed = _compare(arch, tmp_path, bi=True)
    for i in eager:
        assert torch.equal(eager[i], graphed[i]), f"request {i}"
    # every decode step went through the graph path, padded to a bucket (4 -> 5, 3 -> 5)
    assert graph_ex.graphs.steps == 8 and len(rec.layouts) == 8
    assert {lay.num_seqs for lay in rec.layouts} == {5}
    assert len({lay for lay in rec.layouts}) >= 2  # the context bucket moved: another signature
    # the padding requests wrote nothing a real request owns: every paged cache and every real state row match
    for name, cache in eager_ex.caches.items():
        if isinstance(eager_ex.specs[name], StateSpec):
            assert torch.equal(cache[:6], graph_ex.caches[name][:6]), name
        else:
            assert torch.equal(cache, graph_ex.caches[name]), name


def test_padded_decode_default_mode_is_close(tmp_path):
    """Default mode: padding changes the GEMM batch size, which may move the last bits (reported)."""
    _, _, _, eager, graphed = _compare("v4", tmp_path, bi=False)
    worst = max(float((eager[i] - graphed[i]).abs().max()) for i in eager)
    print(f"default mode, padded vs eager decode: max |diff| of hidden states = {worst:.3e}")
    for i in eager:
        torch.testing.assert_close(eager[i], graphed[i], rtol=1e-4, atol=1e-4)


class GraphingCpu(CpuPlatform):
    """The CPU platform claiming graph capture, with the recording identity runner."""

    capabilities = PlatformCapabilities(fp8=False, fp4=False, graph_capture=True, deterministic_kernels=True)

    def __init__(self):
        self.recorder = RecordingRunner()

    def graph_runner(self, fn):
        return self.recorder(fn)


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_engine_decode_graphs_match_eager(tiny_v4_dir, async_scheduling):
    prompts = [random_prompt(n, 70 + n) for n in (4, 40, 130, 9, 77)]
    params = [SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True, logprobs=2),
              SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=12, ignore_eos=True, logprobs=2)] * 3
    outs = {}
    for eager in (True, False):
        platform = GraphingCpu()
        llm = LLM(str(tiny_v4_dir), dtype="float32", max_model_len=512, max_num_seqs=8, batch_invariant=True,
                  kv_cache_memory_bytes=64 << 20, platform=platform, enforce_eager=eager,
                  async_scheduling=async_scheduling, graph_capture_sizes=[1, 2, 4, 8])
        res = llm.generate(prompts, params[:len(prompts)], use_tqdm=False)
        outs[eager] = [(o.outputs[0].token_ids, [sorted((k, v.logprob) for k, v in d.items())
                                                 for d in o.outputs[0].logprobs]) for o in res]
        graphs = llm.llm_engine.executor.graphs
        if eager:
            assert graphs is None and not platform.recorder.layouts
        else:
            assert graphs.steps > 0 and {lay.num_seqs for lay in platform.recorder.layouts} <= {1, 2, 4, 8}
    assert outs[True] == outs[False]


def test_bad_graph_settings_are_named():
    with pytest.raises(ValueError, match="graph_capture_sizes"):
        LLM("deepinfer/tiny-v4", graph_capture_sizes=[0, 4])
    with pytest.raises(ValueError, match="enforce_eager"):
        LLM("deepinfer/tiny-v4", enforce_eager="yes")


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_speculative_verify_steps_graphed_match_eager(tmp_path, async_scheduling):
    """DSpark verify steps (1 + 5 tokens per request) and greedy draft blocks run from the graph path
    too: the same tokens, logprobs and acceptance as eager steps (batch-invariant mode); the proposer
    reads the padded taps."""
    from deepinfer_models.deepseek_v41.agreeing_checkpoint import write_agreeing_v41_checkpoint

    lang = write_agreeing_v41_checkpoint(tmp_path / "agree")
    prompts = [{"prompt_token_ids": lang.prompt(10 + 7 * i, start_token=lang.tokens[(5 * i) % len(lang.tokens)])}
               for i in range(5)]
    params = SamplingParams(temperature=0, max_tokens=30, logprobs=1)
    spec = {"method": "dspark", "num_speculative_tokens": 5, "confidence_scheduling": False}
    res = {}
    for eager in (True, False):
        platform = GraphingCpu()
        llm = LLM(str(tmp_path / "agree"), dtype="float32", max_model_len=512, max_num_seqs=8, batch_invariant=True,
                  kv_cache_memory_bytes=64 << 20, platform=platform, enforce_eager=eager,
                  async_scheduling=async_scheduling, graph_capture_sizes=[1, 2, 4, 8], speculative_config=spec)
        outs = llm.generate(prompts, params, use_tqdm=False)
        stats = llm.llm_engine.spec_decode_stats()
        res[eager] = ([(o.outputs[0].token_ids, [sorted((k, v.logprob) for k, v in d.items())
                                                 for d in o.outputs[0].logprobs]) for o in outs],
                      stats["num_accepted_tokens"], stats["num_drafts"])
        if not eager:
            sizes = {lay.num_tokens // lay.num_seqs for lay in platform.recorder.layouts}
            graphs = llm.llm_engine.executor.graphs
            assert graphs.steps > 0 and 6 in sizes, sizes  # verify steps: anchor + 5 drafts
            assert graphs.draft_steps > 0 and 5 in sizes  # draft blocks of 5 positions
    assert res[True] == res[False]
    assert res[False][1] > 2 * res[False][2]  # drafts really got accepted (> 2 per draft step)


def test_ragged_speculative_steps_are_padded_to_a_graph(tmp_path, monkeypatch):
    """Confidence-trimmed verify steps (requests verify different numbers of drafts) and steps where a
    request has no drafts yet get filler rows up to the longest request and replay a graph; outputs
    equal the eager engine's (batch-invariant mode)."""
    from deepinfer_core.engine.model_runner import ModelRunner
    from deepinfer_models.deepseek_v41.agreeing_checkpoint import write_agreeing_v41_checkpoint

    padded = []
    original = ModelRunner._pad_to_uniform

    def counting(self, so, slices, ids):
        fills = original(self, so, slices, ids)
        padded.append(sum(fills))
        return fills

    monkeypatch.setattr(ModelRunner, "_pad_to_uniform", counting)
    lang = write_agreeing_v41_checkpoint(tmp_path / "agree")
    prompts = [{"prompt_token_ids": lang.prompt(12 + 5 * i, start_token=lang.tokens[(3 * i) % len(lang.tokens)])}
               for i in range(6)]
    params = SamplingParams(temperature=0, max_tokens=24, logprobs=1)
    spec = {"method": "dspark", "num_speculative_tokens": 5, "confidence_scheduling": True,
            "cost_table": {1: 1.0, 64: 1.0 + 63 * 0.06}}
    res = {}
    for eager in (True, False):
        padded.clear()
        platform = GraphingCpu()
        llm = LLM(str(tmp_path / "agree"), dtype="float32", max_model_len=512, max_num_seqs=8, batch_invariant=True,
                  kv_cache_memory_bytes=64 << 20, platform=platform, enforce_eager=eager,
                  graph_capture_sizes=[1, 2, 4, 8], speculative_config=spec, max_num_batched_tokens=40)
        outs = llm.generate(prompts, params, use_tqdm=False)
        res[eager] = [(o.outputs[0].token_ids, [sorted((k, v.logprob) for k, v in d.items())
                                                for d in o.outputs[0].logprobs]) for o in outs]
        stats = llm.llm_engine.spec_decode_stats()
        if eager:
            assert not any(padded)  # no graphs: never padded
        else:
            assert sum(1 for n in padded if n) >= 3, padded  # ragged steps were padded ...
            assert llm.llm_engine.executor.graphs.steps >= sum(1 for n in padded if n)  # ... and replayed
            assert stats["num_verified_tokens"] < 5 * stats["num_drafts"]  # trimming really happened
    assert res[True] == res[False]


def test_warmup_captures_every_bucket_and_writes_nothing(tiny_v4_dir):
    """At start-up every batch bucket is captured (smallest context bucket) with padding requests only:
    no paged cache entry and no real state row is written."""
    platform = GraphingCpu()
    llm = LLM(str(tiny_v4_dir), dtype="float32", max_model_len=512, max_num_seqs=8, batch_invariant=True,
              kv_cache_memory_bytes=64 << 20, platform=platform, graph_capture_sizes=[1, 2, 4, 8])
    ex = llm.llm_engine.executor
    assert sorted(lay.num_seqs for lay in platform.recorder.layouts) == [1, 2, 4, 8]
    assert ex.graphs.steps == 0  # warm-up is not counted as served steps
    for name, cache in ex.caches.items():
        real = cache[:ex.scratch_state_slot] if isinstance(ex.specs[name], StateSpec) else cache
        assert not real.any(), name


@pytest.mark.parametrize("topology", ["mixed", "flash"])
def test_padded_decode_with_topk_wider_than_the_context(topology, tmp_path):
    """index_topk 64 with 2-60 compressed entries per request: the padded step's top-k lists hold more
    -1 entries than the eager step's (its context is the 256 bucket), and the result is still the same
    bits (the H200 sweep's V4.1 ctx-128 rows, where k=512 exceeds the entries, differed from eager)."""
    from deepinfer_models.deepseek_v41.checkpoint_writer import tiny_v41_config, write_tiny_v41_checkpoint

    path = write_tiny_v41_checkpoint(tmp_path / "v41", tiny_v41_config(topology, index_topk=64), quant="fp4", seed=2)
    with kernel_mode(batch_invariant=True):
        model = load_deepseek_v41(path, dtype=torch.float32)
        _, graph_ex, eager, graphed = _run_both(model, [1, 3, 20, 40], RecordingRunner())
    assert graph_ex.graphs.steps == 8 and graph_ex.graphs.min_context == 256
    for i in eager:
        assert torch.equal(eager[i], graphed[i]), f"request {i}"


def test_failed_capture_falls_back_to_eager_steps(tmp_path):
    """A capture that fails after its warm-ups (an op that syncs, a host copy) turns graphs off with the
    reason kept, and that step and every later one run eagerly with the eager results: the warm-ups'
    cache writes are the ones the eager step makes again."""
    def failing_runner(fn):
        def run(*args, **kwargs):
            fn(*args, **kwargs)
            fn(*args, **kwargs)
            raise RuntimeError("simulated capture failure")
        return run

    model = load_deepseek_v41(tiny_ckpt("flash", "fp4"), dtype=torch.float32)
    _, ex, eager, fallback = _run_both(model, [5, 9, 20, 40], failing_runner)
    assert "simulated capture failure" in ex.graphs.disabled_reason and ex.graphs.steps == 0
    for i in eager:
        assert torch.equal(eager[i], fallback[i]), f"request {i}"


def test_ids_fed_on_the_device_give_the_host_packed_step(tmp_path):
    """``DecodeGraphs.run(..., ids_on_device=True)``: the host packs zero ids and the ids are written into
    the uploaded tensor afterwards (how a step takes the previous step's sampled ids before they reach
    the host). Same hidden states as ids packed on the host, and the host never saw the ids."""
    from deepinfer_core.runner.context import SeqSlice
    from deepinfer_core.runner.simple_driver import SimpleBlockAllocator

    model = _load("v4", tmp_path, bi=True)
    ex = PagedExecutor(model, num_blocks=64, max_num_seqs=4, graph_runner=RecordingRunner(), graph_batch_sizes=(4,),
                       max_context=512)
    gen = torch.Generator().manual_seed(0)
    for t in ex.caches.values():
        t.copy_(torch.randn(t.shape, generator=gen))
    alloc = SimpleBlockAllocator(ex)
    ctxs = [7, 40, 129]  # 3 requests: one padding request fills the bucket of 4
    slices = [SeqSlice(c, 1, alloc.tables_for(i, c + 1), state_slot=i) for i, c in enumerate(ctxs)]
    ids = torch.tensor([11, 5, 23])
    packed_ids = []
    real_pack = ex.graphs.pack
    ex.graphs.pack = lambda sl, step_ids, *a: packed_ids.append(list(step_ids)) or real_pack(sl, step_ids, *a)
    state = {n: c.clone() for n, c in ex.caches.items()}
    host_fed = ex.graphs.run(ids, slices).clone()
    for n, c in ex.caches.items():  # the same step again from the same caches
        c.copy_(state[n])
    device_fed = ex.graphs.run(ids, slices, ids_on_device=True).clone()
    assert packed_ids == [[11, 5, 23], [0, 0, 0]]
    assert torch.equal(host_fed, device_fed)
    assert not torch.equal(host_fed, ex.graphs.run(torch.tensor([12, 5, 23]), slices))  # the ids do matter
