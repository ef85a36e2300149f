"""FP8 routed experts on the H200 (not run in CI): ``moe.experts_fp8`` (providers ``triton`` and ``triton_bi``)
with ``triton_moe.FP8_GROUPED`` on, against the reference on the CPU, with NaN-poisoned outputs and fresh inputs
per case. When these pass, ``FP8_GROUPED`` can default to True.

- the grouped kernels (``triton_moe_fp8``) at decode sizes, bf16 and fp32, fp32 (V4-Flash-Base) and UE8M0 scales,
  [128, 128] and [32, 32] blocks, D and F with K-tile tails, routings that crowd one expert;
- prefill sizes (the per-expert loop from ``triton_moe.FP8_LOOP_PAIRS``);
- capture into a CUDA graph and replay with new routing (the reason the grouped form exists);
- batch invariance of ``triton_bi``: a token's bits do not depend on the rest of the batch.

    python3 -m pytest -q deepinfer_nvidia/tests/test_conformance_moe_fp8.py
"""
from __future__ import annotations

import pytest
import torch

from deepinfer_nvidia.tests.test_conformance import _gen, _routing, close, poison

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")


@pytest.fixture(scope="module", autouse=True)
def fp8_grouped():
    """These tests are what ``triton_moe.FP8_GROUPED`` waits for: switched on here, restored after."""
    from deepinfer_nvidia.kernels import triton_moe

    before, triton_moe.FP8_GROUPED = triton_moe.FP8_GROUPED, True
    yield
    triton_moe.FP8_GROUPED = before


@pytest.fixture(scope="module")
def reg():
    from deepinfer_core.kernels.registry import get_registry
    from deepinfer_core.kernels.resolve import ensure_platform_kernels
    from deepinfer_nvidia.platform import NvidiaPlatform

    r = get_registry()
    ensure_platform_kernels(r, NvidiaPlatform())
    return r

_STACKS: dict = {}


def _fp8_stacks(e: int, d: int, f: int, block, fmt):
    """Random FP8 expert stacks (w1, s1, w3, s3, w2, s2) on the CPU, cached per shape and format."""
    from deepinfer_core.kernels.ops.quant import quant_fp8_block

    key = (e, d, f, tuple(block), fmt)
    if key not in _STACKS:
        g = _gen(700 + d + f)

        def stack(n, kk):
            q = [quant_fp8_block(torch.randn(n, kk, generator=g) / kk ** 0.5, block, fmt) for _ in range(e)]
            return [torch.stack([a for a, _ in q]), torch.stack([b for _, b in q])]

        _STACKS[key] = stack(f, d) + stack(f, d) + stack(d, f)
    return _STACKS[key]


def _case(seed, t, k, route, dtype, e=16, d=640, f=288, block=(128, 128), fmt=None):
    from deepinfer_core.kernels.ops.moe import experts_fp8

    ws = _fp8_stacks(e, d, f, block, fmt)
    g = _gen(seed)
    x = torch.randn(t, d, generator=g).to(dtype)
    ids, w = _routing(t, k, e, route, g)
    return experts_fp8(x, w, ids, *ws, block, 1.0), [a.cuda() for a in [x, w, ids] + ws]


@pytest.mark.parametrize("t,k,route", [(1, 6, "rand"), (8, 6, "one"), (17, 3, "skew"), (64, 6, "rand"),
                                       (300, 6, "rand"), (512, 6, "skew")])
@pytest.mark.parametrize("block,fmt", [((128, 128), None), ((128, 128), "ue8m0"), ((32, 32), "ue8m0")])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("provider", ["triton", "triton_bi"])
def test_moe_experts_fp8_grouped(reg, t, k, route, block, fmt, dtype, provider):
    ref, cu = _case(800 + t, t, k, route, dtype, block=block, fmt=fmt)
    poison()
    out = reg.impl("moe.experts_fp8", provider)(*cu, block, 1.0)
    tol = 3e-2 if dtype == torch.bfloat16 else 1e-4
    close(out, ref, tol, tol)


def test_moe_experts_fp8_prefill_loop(reg):
    """From ``FP8_LOOP_PAIRS`` pairs the per-expert loop runs; it matches the reference too."""
    from deepinfer_nvidia.kernels import triton_moe

    t = triton_moe.FP8_LOOP_PAIRS // 6 + 1
    ref, cu = _case(900, t, 6, "rand", torch.bfloat16)
    poison()
    close(reg.impl("moe.experts_fp8", "triton")(*cu, (128, 128), 1.0), ref, 3e-2, 3e-2)


@pytest.mark.parametrize("provider", ["triton", "triton_bi"])
def test_moe_experts_fp8_graph_capture(reg, provider):
    """No host sync: the op captures into a CUDA graph and replays with new routing."""
    from deepinfer_core.kernels.ops.moe import experts_fp8
    from deepinfer_nvidia.graphs import CudaGraphRunner

    fn = reg.impl("moe.experts_fp8", provider)
    block = (128, 128)
    ws = [a.cuda() for a in _fp8_stacks(8, 256, 128, block, None)]
    runner = CudaGraphRunner(lambda x, w, ids: fn(x, w, ids, *ws, block, 10.0))
    g = _gen(78)
    for _ in range(3):
        x = torch.randn(12, 256, generator=g).bfloat16()
        ids, w = _routing(12, 2, 8, "rand", g)
        out = runner(x.cuda(), w.cuda(), ids.cuda())
        close(out, experts_fp8(x, w, ids, *[a.cpu() for a in ws], block, 10.0), 3e-2, 3e-2)
    assert runner.num_graphs == 1


def test_moe_experts_fp8_bi_is_batch_invariant(reg):
    fn = reg.impl("moe.experts_fp8", "triton_bi")
    _, cu = _case(901, 256, 6, "rand", torch.bfloat16)
    x, w, ids, *ws = cu
    whole = fn(x, w, ids, *ws, (128, 128), 1.0)
    for lo, hi in ((0, 1), (5, 12), (100, 164)):
        part = fn(x[lo:hi].contiguous(), w[lo:hi].contiguous(), ids[lo:hi].contiguous(), *ws, (128, 128), 1.0)
        assert torch.equal(part, whole[lo:hi]), (lo, hi)
