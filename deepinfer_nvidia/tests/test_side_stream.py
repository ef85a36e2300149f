"""``stream.side`` on a second CUDA stream (``cuda_side_stream``) on the GPU (skipped without an SM90 device).

    python3 -m pytest -q deepinfer_nvidia/tests/test_side_stream.py

- the shared harness's cases (a small MLP as the branch) against the reference;
- the MoE layer's shape of work: a branch of split-K wgmma GEMVs + the SwiGLU (the shared expert at V4.1's widths)
  forked beside split-K GEMVs and a dense split-K GEMV on the current stream (the router, the routed path), many
  times with fresh inputs: bit for bit the in-order result. The two streams' GEMVs are in flight together, so a
  shared split-K arrival counter would corrupt both (each lane has its own);
- the same under programmatic dependent launch, eager and captured in one CUDA graph (fork and join inside the
  capture), replayed with fresh inputs: the in-order bits each time;
- a nested branch, a branch of more than ``SIDE_MAX_ROWS`` rows (prefill) and the knob off run in order;
- branches open at once (the mHC mix, the Engram lookups) take separate streams and lanes: two branches of split-K
  GEMVs in flight beside the current stream's, bit for bit the in-order result, and a joined stream is reused.
"""
from __future__ import annotations

import pytest
import torch

from deepinfer_nvidia.tests.test_conformance import _gen, poison

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                                reason="needs an SM90 GPU")


@pytest.fixture
def side_on(monkeypatch):
    from deepinfer_nvidia.kernels import cuda_side_stream as css

    monkeypatch.setattr(css, "SIDE_STREAM", True)
    return css


def test_harness_cases(side_on, nvidia_reg):
    from deepinfer_core.testing.conformance import check_impl

    assert check_impl("stream.side", "aten", "cuda", registry=nvidia_reg) == 12


def _fp8(n, k, seed):
    from deepinfer_core.kernels.ops.quant import quant_fp8_block

    q, s = quant_fp8_block(torch.randn(n, k, generator=_gen(seed)) / k ** 0.5, (32, 32), "ue8m0")
    return q.cuda(), s.view(torch.uint8).contiguous().cuda()


class _Layer:
    """The MoE layer's launches at V4.1's widths: shared expert (w1 | w3 as one 4608-row GEMV, the SwiGLU, w2) as
    the branch; on the current stream the fp32 router GEMV (``gemm.dense_wide``, split-K) and two GEMVs standing in
    for the routed path (5120 -> 1280 -> 5120, split-K)."""

    def __init__(self, seed: int):
        from deepinfer_nvidia.kernels.triton_norm import rms

        self.rms = rms
        self.w13, self.w2 = _fp8(4608, 5120, seed), _fp8(5120, 2304, seed + 1)
        self.wa, self.wb = _fp8(1280, 5120, seed + 2), _fp8(5120, 1280, seed + 3)
        self.gate_w = (torch.randn(384, 5120, generator=_gen(seed + 4)) / 5120 ** 0.5).cuda()
        self.norm_w = (torch.rand(5120, generator=_gen(seed + 5)) + 0.5).bfloat16().cuda()

    @staticmethod
    def gemv(x, w):
        from deepinfer_nvidia.kernels import gluon_fp8_gemv as gg

        q, s = w
        return gg.gemv_wgmma(x, q, s, s.shape[1], 32, 32, 132)

    def shared(self, h):
        from deepinfer_nvidia.kernels.triton_swiglu import clamped_swiglu

        gu = self.gemv(h, self.w13)
        return self.gemv(clamped_swiglu(gu[:, :2304], gu[:, 2304:], 10.0), self.w2)

    def __call__(self, x, enabled: bool):
        from deepinfer_nvidia.kernels.cuda_side_stream import side
        from deepinfer_nvidia.kernels.triton_dense_gemv import gemm_dense_wide

        h = self.rms(x, self.norm_w, 1e-6)
        branch = side(self.shared, h, enabled=enabled)
        logits = gemm_dense_wide(h, self.gate_w)
        routed = self.gemv(self.gemv(h, self.wa), self.wb) * logits[:, :1].to(torch.bfloat16)
        return routed + branch.join()


@pytest.mark.parametrize("t", [1, 4, 16])
def test_branch_beside_split_k_gemvs_is_bit_equal(t, side_on):
    layer = _Layer(40 + t)
    poison()
    for seed in range(20):
        x = torch.randn(t, 5120, generator=_gen(100 + seed)).bfloat16().cuda()
        want = layer(x, enabled=False)
        got = layer(x, enabled=True)
        torch.cuda.synchronize()
        assert torch.isfinite(want.float()).all()
        assert torch.equal(got, want), seed


@pytest.mark.parametrize("pdl", [1, 0])
def test_branch_in_a_cuda_graph_replays(pdl, side_on, monkeypatch):
    from deepinfer_nvidia.kernels import _common

    monkeypatch.setattr(_common, "PDL", pdl)
    layer = _Layer(70)
    static = torch.randn(1, 5120, generator=_gen(71)).bfloat16().cuda()
    layer(static, enabled=True)  # warm-up: compiles, and makes the side lane's counters outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = layer(static, enabled=True)
    for seed in range(5):
        fresh = torch.randn(1, 5120, generator=_gen(80 + seed)).bfloat16().cuda()
        static.copy_(fresh)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, layer(fresh, enabled=False)), seed


def test_nested_branch_runs_inline_and_knob_off_in_order(side_on, monkeypatch):
    from deepinfer_core.kernels.ops.stream import Joined
    from deepinfer_nvidia.kernels import cuda_side_stream as css

    x = torch.randn(8, 64, device="cuda")
    inner = []

    def outer(a):
        assert css.lane() == 1 and torch.cuda.current_stream() != torch.cuda.default_stream()
        b = css.side(torch.tanh, a)
        inner.append(b)
        return b.join() * 2

    branch = css.side(outer, x)
    assert isinstance(inner[0], Joined)  # nested: inline, on the side stream
    assert torch.equal(branch.join(), torch.tanh(x) * 2) and css.lane() == 0
    assert isinstance(css.side(torch.tanh, torch.randn(css.SIDE_MAX_ROWS + 1, 64, device="cuda")), Joined)  # prefill
    assert not isinstance(css.side(torch.tanh, torch.randn(css.SIDE_MAX_ROWS, 64, device="cuda")), Joined)
    monkeypatch.setattr(css, "SIDE_STREAM", False)
    assert isinstance(css.side(torch.tanh, x), Joined)


def test_open_branches_take_separate_streams_and_lanes(side_on, monkeypatch):
    """Two branches open at once, each a split-K GEMV chain (the shared expert's shape), beside the current stream's
    split-K GEMVs: separate streams and lanes (split-K counters), the in-order bits, and after both joins the first
    stream (lane 1) serves the next branch."""
    css = side_on
    monkeypatch.setattr(css, "SIDE_STREAMS", 4)
    monkeypatch.setattr(css, "_POOLS", {})
    layer = _Layer(90)
    lanes = []

    def shared_in_lane(h):
        lanes.append((css.lane(), torch.cuda.current_stream()))
        return layer.shared(h)

    for seed in range(10):
        x = torch.randn(1, 5120, generator=_gen(300 + seed)).bfloat16().cuda()
        y = torch.randn(1, 5120, generator=_gen(400 + seed)).bfloat16().cuda()
        want = (layer.shared(x), layer.shared(y), layer.gemv(layer.gemv(x, layer.wa), layer.wb))
        lanes.clear()
        a = css.side(shared_in_lane, x)
        b = css.side(shared_in_lane, y)  # a is still open
        main = layer.gemv(layer.gemv(x, layer.wa), layer.wb)
        got = (a.join(), b.join(), main)
        torch.cuda.synchronize()
        assert [ln for ln, _ in lanes] == [1, 2] and lanes[0][1] != lanes[1][1]
        assert all(torch.equal(g, w) for g, w in zip(got, want)), seed
    c = css.side(shared_in_lane, x)
    assert lanes[-1][0] == 1 and lanes[-1][1] == lanes[0][1]  # both joined: the first stream again
    c.join()


def test_chain_priority_graph_replays_bit_equal(side_on, monkeypatch):
    """``DEEPINFER_NV_CHAIN_PRIORITY`` (on by default): the platform's graph runner captures on a highest-priority
    stream while two branches (split-K GEMV chains, one joined after the chain's work: an Engram lookup's shape, one
    forked beside it: the shared expert's) run on side streams of the lowest priority. Every replay with fresh inputs
    gives the in-order bits."""
    from deepinfer_nvidia import graphs

    css = side_on
    monkeypatch.setattr(css, "CHAIN_PRIORITY", "1")
    monkeypatch.setattr(css, "_POOLS", {})
    monkeypatch.setattr(graphs, "_CAPTURE_STREAMS", {})
    layer = _Layer(120)
    lo, hi = torch.cuda.Stream.priority_range()  # (lowest, highest): e.g. (0, -5)
    seen = []

    def in_lane(h):
        seen.append(torch.cuda.current_stream().priority)
        return layer.shared(h)

    def step(x):
        early = css.side(in_lane, x)
        h = layer.rms(x, layer.norm_w, 1e-6)
        beside = css.side(in_lane, h)
        main = layer.gemv(layer.gemv(h, layer.wa), layer.wb)
        return main + beside.join() + early.join()

    def in_order(x):
        h = layer.rms(x, layer.norm_w, 1e-6)
        return layer.gemv(layer.gemv(h, layer.wa), layer.wb) + layer.shared(h) + layer.shared(x)

    runner = graphs.CudaGraphRunner(step)
    for seed in range(5):
        x = torch.randn(1, 5120, generator=_gen(500 + seed)).bfloat16().cuda()
        got = runner(x)
        torch.cuda.synchronize()
        assert torch.equal(got, in_order(x)), seed
    assert runner.num_graphs == 1
    assert graphs._capture_stream().priority == hi and set(seen) == {lo}
