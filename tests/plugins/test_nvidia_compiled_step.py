"""``DEEPINFER_NV_COMPILE=1`` (``deepinfer_nvidia/graphs.py``): the decode step compiled by ``torch.compile``
before capture, checked on the CPU.

The CUDA graph itself needs a GPU; here the compiled step function runs through the executor's graph path with
no capture (the runner is ``compiled_step`` alone) on a tiny V4.1 checkpoint, against the eager executor: same
hidden states within fp32 rounding (inductor fuses the glue, so bits may differ) and really compiled.
"""
from __future__ import annotations

import pytest
import torch

from deepinfer_nvidia import graphs


@pytest.mark.parametrize("value,want", [("", False), ("0", False), ("1", True)])
def test_knob(monkeypatch, value, want):
    monkeypatch.setenv("DEEPINFER_NV_COMPILE", value)
    monkeypatch.delenv("DEEPINFER_BATCH_INVARIANT", raising=False)
    assert graphs.compile_enabled() is want


def test_knob_refuses_other_values_and_batch_invariant_mode(monkeypatch):
    monkeypatch.setenv("DEEPINFER_NV_COMPILE", "on")
    with pytest.raises(ValueError, match="DEEPINFER_NV_COMPILE must be 0 or 1"):
        graphs.compile_enabled()
    monkeypatch.setenv("DEEPINFER_NV_COMPILE", "1")
    monkeypatch.setenv("DEEPINFER_BATCH_INVARIANT", "1")
    assert graphs.compile_enabled() is False


def test_compiled_decode_steps_match_eager(tmp_path):
    from torch._dynamo.utils import counters

    from deepinfer_core.runner.executor import PagedExecutor
    from deepinfer_core.runner.simple_driver import run_requests
    from deepinfer_models.deepseek_v41.checkpoint_writer import tiny_v41_config, write_tiny_v41_checkpoint
    from deepinfer_models.deepseek_v41.loading import load_deepseek_v41

    write_tiny_v41_checkpoint(tmp_path, tiny_v41_config("flash"), quant="fp4", seed=2)
    g = torch.Generator().manual_seed(0)
    lens = [5, 14]
    reqs = [torch.randint(3, 129000, (n + 3,), generator=g).tolist() for n in lens]
    schedule = [[(i, n) for i, n in enumerate(lens)]] + [[(0, 1), (1, 1)]] * 3  # prefill, then 3 decode steps

    class Platform:  # the two hooks the nvidia platform uses, on the CPU: opaque kernels, compiled steps
        name, default_providers = "compiled-step-test", ()

        def register_kernels(self, registry):
            pass

        wrap_kernel = staticmethod(graphs.opaque_kernel)

    def run(runner):
        model = load_deepseek_v41(str(tmp_path), dtype=torch.float32, platform=Platform() if runner else None)
        ex = PagedExecutor(model, num_blocks=128, max_num_seqs=4, graph_runner=runner, graph_batch_sizes=(2,),
                           max_context=256)
        return run_requests(ex, reqs, schedule), ex

    eager, _ = run(None)
    counters.clear()
    torch._dynamo.reset()
    compiled, ex = run(graphs.compiled_step)
    assert ex.graphs is not None and ex.graphs.steps == 3 and ex.graphs.disabled_reason is None
    assert counters["stats"]["unique_graphs"] > 0  # dynamo compiled (parts of) the step
    for i in range(len(reqs)):
        torch.testing.assert_close(compiled[i], eager[i], atol=1e-4, rtol=1e-4)
    torch._dynamo.reset()


def test_steps_compile_only_when_every_kernel_is_opaque(monkeypatch):
    """A kernel resolved while compiling was off (batch-invariant mode is entered around model loading, not
    around capture) would be traced by dynamo; then the platform's graph runner does not compile (H200, pass28e:
    inductor failed on a Triton launcher and the capture fell back to eager steps)."""
    from deepinfer_nvidia.platform import NvidiaPlatform

    p = NvidiaPlatform.__new__(NvidiaPlatform)  # no GPU here: only the bookkeeping of the two hooks
    p._kernels_opaque = p._kernels_plain = 0
    monkeypatch.setenv("DEEPINFER_NV_COMPILE", "1")
    monkeypatch.delenv("DEEPINFER_BATCH_INVARIANT", raising=False)

    def kernel(x):
        return x + 1

    assert not p.compiles_steps()  # nothing resolved yet
    wrapped = p.wrap_kernel(kernel)
    assert wrapped is not kernel and wrapped(1) == 2 and p.compiles_steps()
    monkeypatch.setenv("DEEPINFER_BATCH_INVARIANT", "1")
    assert p.wrap_kernel(kernel) is kernel
    monkeypatch.delenv("DEEPINFER_BATCH_INVARIANT")
    assert not p.compiles_steps()


def test_every_bucket_compiles_past_dynamos_default_limit():
    """Static shapes: each (batch, context) signature of a step shaped like ``DecodeGraphs._step`` (packed int64
    metadata plus a hashable layout of host ints, an opaque kernel between glue ops) gets its own compiled graph,
    and a signature seen before compiles nothing. Dynamo's recompile limit (8 by default) is raised, or buckets
    past the eighth would run as eager frames (15 batch buckets times a few contexts are normal). (Dynamic
    shapes were measured slower on the H200: pass29b.)"""
    import dataclasses

    from torch._dynamo.utils import counters

    @dataclasses.dataclass(frozen=True)
    class Layout:
        num_seqs: int
        ctx: int

    kernel = graphs.opaque_kernel(lambda x, idx: x[idx].sum(-1))
    weight = torch.randn(64, 8)

    def step(packed: torch.Tensor, layout: Layout) -> torch.Tensor:
        ids = packed[:layout.num_seqs]
        table = packed[layout.num_seqs:].view(layout.num_seqs, layout.ctx)
        x = torch.nn.functional.silu(weight[ids % 64].float()) * 2.0  # glue
        s = kernel(weight, table % 64)  # the registered kernel: a graph break
        return x + s.sum(-1, keepdim=True)

    torch._dynamo.reset()
    counters.clear()
    fn = graphs.compiled_step(step)
    limit = getattr(torch._dynamo.config, "recompile_limit", None) or torch._dynamo.config.cache_size_limit
    assert limit >= graphs._COMPILE_RECOMPILES
    shapes = [(1, 8), (2, 8), (2, 16)]
    seen = []
    for b, ctx in shapes + shapes:  # each signature twice
        packed = torch.randint(0, 1000, (b + b * ctx,))
        torch.testing.assert_close(fn(packed, Layout(b, ctx)), step(packed, Layout(b, ctx)))
        seen.append(counters["stats"]["unique_graphs"])
    torch._dynamo.reset()
    per_signature = seen[0]
    assert per_signature > 0
    assert seen[:3] == [per_signature * (i + 1) for i in range(3)], seen  # every signature compiled
    assert seen[3:] == [seen[2]] * 3  # and none twice
