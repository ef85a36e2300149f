"""``sample.topk_topp_minp`` (Triton threshold searches, ``triton_sampling.py``) against the reference on the GPU
(skipped without one): the op's own generated cases with the harness comparator (identical -inf mask), then
hard cases at DeepSeek V4's vocabulary (V = 129280), B 1 / 8 / 64 / 256, fp32 and bf16 logits: exact ties
(bf16-rounded logits, four distinct values, all-equal rows, +0.0 / -0.0), ties at the k-th value, top_k 1 / V / off,
top_p 1e-6 / 0 / 0.999 / off, min_p up to 1.0, -inf entries and all -inf rows. Outputs come from a NaN-poisoned
allocator, the call runs under ``set_sync_debug_mode("error")``, is captured in a CUDA graph and replayed with new
logits, and each row alone equals that row inside the batch, bit for bit.

Hard cases allow a mask difference only at tokens whose decision hinges on fp32 rounding (top-p mass before the
token within 1e-5 of p, or a probability within 1e-5 of min-p's threshold, found in float64): the caveat in the
kernel's docstring. Kept values must equal the logits bit for bit.
"""
from __future__ import annotations

import pytest
import torch

from deepinfer_nvidia.tests.device_helpers import checked_call

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")

V4_VOCAB = 129280
NEG = float("-inf")


@pytest.fixture(scope="module")
def fn():
    """The kernel at every batch size (the op itself runs the reference below ``MIN_ROWS`` rows)."""
    from deepinfer_nvidia.kernels import triton_sampling

    saved, triton_sampling.MIN_ROWS = triton_sampling.MIN_ROWS, 0
    yield triton_sampling.topk_topp_minp
    triton_sampling.MIN_ROWS = saved


def near_boundary(x, top_k, top_p, min_p, tol=1e-5):
    """Tokens whose decision is within fp32 rounding (core's ``rounding_boundary_tokens``)."""
    from deepinfer_core.kernels.ops.sampling import rounding_boundary_tokens

    return rounding_boundary_tokens(x, top_k, top_p, min_p, tol)


def check(out, x, top_k, top_p, min_p) -> int:
    """The reference's mask except at rounding-bound tokens; kept logits unchanged. Returns the differences."""
    from deepinfer_core.kernels.ops.sampling import topk_topp_minp

    ref = topk_topp_minp(x, top_k, top_p, min_p)
    assert out.shape == ref.shape and out.dtype == ref.dtype, (out.shape, out.dtype, ref.dtype)
    assert not torch.isnan(out).any(), "output has NaN: an element was never written"
    om, rm = torch.isneginf(out), torch.isneginf(ref)
    diff = om != rm
    bad = diff & ~near_boundary(x, top_k, top_p, min_p)
    assert not bad.any(), ("masks differ", bad.nonzero()[:8].tolist())
    assert torch.equal(out[~om], x[~om]), "kept logits changed"
    return int(diff.sum())


def rows(b: int, v: int, seed: int, dtype: torch.dtype):
    """B rows of mixed hard kinds and per-row parameters (row i: kind i % 8), on the GPU."""
    g = torch.Generator().manual_seed(seed)
    x = torch.empty(b, v)
    for i in range(b):
        kind = (i + seed) % 8
        r = 3 * torch.randn(v, generator=g)
        if kind == 1:
            r = r.bfloat16().float()  # many exact ties
        elif kind == 2:
            r = torch.randint(0, 4, (v,), generator=g).float() * 0.5  # four values: huge tie groups
        elif kind == 3:
            r = torch.zeros(v)
            r[::3] = -0.0  # all equal, +0.0 and -0.0 tied
        elif kind == 4:  # 5, four 4s, twenty 3s: ties at the k-th value
            r = torch.full((v,), -3.0)
            r[:25] = torch.tensor([5.0] + [4.0] * 4 + [3.0] * 20)
            r = r[torch.randperm(v, generator=g)]
        elif kind == 5:
            r[torch.rand(v, generator=g) < 0.6] = NEG
        elif kind == 6:
            r[:] = NEG
            r[torch.randint(0, v, (3,), generator=g)] = 1.0
        elif kind == 7 and i < 8:
            r[:] = NEG  # an all -inf row
        x[i] = r
    ks = torch.tensor([1, 2, 5, 50, v, 0, -1, 20, 4, 1000])
    ps = torch.tensor([1e-6, 0.3137, 0.9071, 0.999, 0.5003, 1.0, 0.0, 0.7311, 0.95, 1.0])
    mps = torch.tensor([0.0, 0.0, 0.3, 0.0, 0.9, 1.0, 0.05, 0.0, 0.0, 0.02])
    i = torch.arange(b)
    return (x.to(dtype).cuda(), ks[i % 10].cuda(), ps[(i * 3 + seed) % 10].cuda(), mps[(i * 7 + 2 * seed) % 10].cuda())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_generated_cases(fn, dtype):
    from deepinfer_core.kernels.ops.sampling import _compare_masked, _gen_filters, topk_topp_minp

    n = 0
    for seed in range(4):
        for args, _ in _gen_filters(dtype, "cuda", seed):
            _compare_masked(fn(*args), topk_topp_minp(*args), dtype)
            n += 1
    assert n == 16


@pytest.mark.parametrize("b", [1, 8, 64, 256])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_v4_vocab(fn, b, dtype):
    for seed in (0, 1, 2):
        args = rows(b, V4_VOCAB, b + seed, dtype)
        fn(*args)  # compile outside the sync check
        check(checked_call(fn, *args), *args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_graph_replay_and_row_invariance(fn, dtype):
    b = 64
    static = rows(b, V4_VOCAB, 5, dtype)
    fn(*static)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(*static)
    for seed in (6, 7):
        fresh = rows(b, V4_VOCAB, seed, dtype)
        for s, f in zip(static, fresh):
            s.copy_(f)
        graph.replay()
        torch.cuda.synchronize()
        check(out, *fresh)
    bits = {2: torch.int16, 4: torch.int32}[out.element_size()]
    for i in (0, 3, 7, 31, 63):
        alone = fn(*(a[i:i + 1].clone() for a in fresh))
        assert torch.equal(alone[0].view(bits), out[i].view(bits)), f"row {i} depends on the batch"
