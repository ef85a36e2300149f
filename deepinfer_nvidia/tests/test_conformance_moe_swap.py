"""The Gluon swap-AB MXFP4 expert kernels (``gluon_moe_swap``, SM90 only) against the reference on the GPU:
tiles, cp.async ring depths 2-8, both decodes, extreme scale bytes, split-K launches and TMA weight tiles, with
graph replays (skipped without an SM90 device and Gluon). Outputs are poisoned with NaN first. The shared
helpers and the other MoE paths' cases are in ``test_conformance.py``."""
from __future__ import annotations

import pytest
import torch

from deepinfer_nvidia.tests.test_conformance import _gen, _mxfp4_case, _mxfp4_stacks, _routing, close, poison


@pytest.fixture(scope="module")
def reg():
    """The registry with the nvidia kernels loaded (as the engine resolves them)."""
    from deepinfer_core.kernels.registry import get_registry
    from deepinfer_core.kernels.resolve import ensure_platform_kernels
    from deepinfer_nvidia.platform import NvidiaPlatform

    r = get_registry()
    ensure_platform_kernels(r, NvidiaPlatform())
    return r


@pytest.mark.parametrize("t,k,route,bm,bk,stages", [(1, 6, "rand", 16, 128, 3), (8, 6, "one", 16, 128, 2),
                                                    (17, 3, "skew", 32, 128, 3), (64, 6, "rand", 16, 256, 2),
                                                    (300, 6, "rand", 64, 128, 3), (300, 6, "skew", 16, 64, 4),
                                                    (1, 6, "rand", 16, 128, 6), (8, 6, "rand", 16, 128, 8),
                                                    (64, 6, "rand", 0, 0, 0)])
@pytest.mark.parametrize("safe", [None, True])
def test_moe_experts_mxfp4_swap(reg, t, k, route, bm, bk, stages, safe):
    """The Gluon swap-AB path (SM90 only) against the reference, bf16: one token to several blocks of one expert,
    K tiles 64-256 with tails (D=640, F=288), 2-8 cp.async stages (6 and 8: more than D's 5 K tiles, so the ring
    is never full); ``safe`` None: the wrapper picks the decode from the scale bytes, True: the exact
    two-multiply decode; ``bm`` 0: the module's own tiles."""
    from deepinfer_nvidia.kernels import gluon_moe_swap as sw

    if not (sw.available() and torch.cuda.get_device_capability()[0] == 9):
        pytest.skip("Gluon wgmma path: SM90 with triton.experimental.gluon only")
    ref, cu = _mxfp4_case(1300 + t * 10 + k, t, k, route, torch.bfloat16)
    poison()
    out = sw.swap_mxfp4(*cu, 1.0, block_m=bm or None, block_k=bk or None, stages=stages or None, safe=safe)
    close(out, ref, 3e-2, 3e-2)


@pytest.mark.parametrize("t,k,route,bm,split", [(1, 6, "rand", 16, (3, 2)), (1, 6, "rand", 16, (5, 3)),
                                                  (2, 6, "one", 16, (2, 2)), (8, 6, "rand", 16, (4, 1)),
                                                  (17, 3, "skew", 32, (1, 3)), (64, 6, "rand", 0, (2, 2))])
def test_moe_experts_mxfp4_swap_split_k(reg, t, k, route, bm, split):
    """Split-K swap launches ((up, down) splits over K tiles of 5 and 3 at D=640, F=288: the last split short)
    against the reference; then replayed three times from one CUDA graph with fresh inputs (the arrival counters
    must come back to zero each time) against the unsplit launch within the reduction-order tolerance."""
    from deepinfer_nvidia.kernels import gluon_moe_swap as sw

    if not (sw.available() and torch.cuda.get_device_capability()[0] == 9):
        pytest.skip("Gluon wgmma path: SM90 with triton.experimental.gluon only")
    ref, cu = _mxfp4_case(1500 + t * 10 + k, t, k, route, torch.bfloat16)
    poison()
    out = sw.swap_mxfp4(*cu, 1.0, block_m=bm or None, split=split)
    close(out, ref, 3e-2, 3e-2)
    x = cu[0].clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = sw.swap_mxfp4(x, *cu[1:], 1.0, block_m=bm or None, split=split)
    for i in range(3):
        x.copy_(torch.randn(x.shape, generator=_gen(1600 + i)).to(x.dtype))
        poison()
        graph.replay()
        plain = sw.swap_mxfp4(x, *cu[1:], 1.0, block_m=bm or None, split=(1, 1))
        torch.testing.assert_close(y, plain, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("t,k,route,bm,stages,split", [(1, 6, "rand", 16, 3, None), (1, 6, "rand", 16, 6, None),
                                                         (2, 6, "rand", 16, 3, (3, 1)), (8, 6, "one", 16, 2, None),
                                                         (17, 3, "skew", 32, 4, (2, 2)), (300, 6, "rand", 64, 3, None),
                                                         (64, 6, "rand", 0, 0, None)])
def test_moe_experts_mxfp4_swap_tma(reg, t, k, route, bm, stages, split):
    """The swap path with its weight tiles by TMA (``tma=True``) against the reference and against the cp.async
    launch (reduction order identical: equal within bf16 rounding of the same sums), at D=640, F=320 (TMA needs
    N a multiple of 64; K tails of the 128-column tiles in the down launch); 2-6 stages, split-K launches, and one
    CUDA graph replayed with fresh inputs (the mbarrier phases start over each launch)."""
    from deepinfer_core.kernels.ops.moe import experts_mxfp4
    from deepinfer_nvidia.kernels import gluon_moe_swap as sw

    if not (sw.available() and torch.cuda.get_device_capability()[0] == 9):
        pytest.skip("Gluon wgmma path: SM90 with triton.experimental.gluon only")
    e, d, f = 16, 640, 320
    ws = _mxfp4_stacks(e, d, f, 610)
    g = _gen(1700 + t * 10 + k)
    x = torch.randn(t, d, generator=g).bfloat16()
    ids, w = _routing(t, k, e, route, g)
    ref = experts_mxfp4(x, w, ids, *ws, 1.0)
    cu = [a.cuda() for a in [x, w, ids] + ws]
    assert all(sw.tma_fits(cu[i].view(torch.uint8), 64, 128) for i in (3, 5, 7))
    kw = dict(block_m=bm or None, stages=stages or None, split=split)
    poison()
    out = sw.swap_mxfp4(*cu, 1.0, tma=True, **kw)
    close(out, ref, 3e-2, 3e-2)
    torch.testing.assert_close(out, sw.swap_mxfp4(*cu, 1.0, tma=False, **kw), rtol=0, atol=0)
    xs = cu[0].clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = sw.swap_mxfp4(xs, *cu[1:], 1.0, tma=True, **kw)
    for i in range(3):
        xs.copy_(torch.randn(xs.shape, generator=_gen(1800 + i)).to(xs.dtype))
        poison()
        graph.replay()
        torch.testing.assert_close(y, sw.swap_mxfp4(xs, *cu[1:], 1.0, tma=False, **kw), rtol=0, atol=0)


def test_moe_experts_mxfp4_swap_extreme_scales(reg):
    """Scale bytes over 0..254 (subnormal 2^-127 to 2^127 weights): the wrapper must pick the exact decode and
    match the reference wherever the reference is finite."""
    from deepinfer_core.kernels.ops.moe import experts_mxfp4
    from deepinfer_nvidia.kernels import gluon_moe_swap as sw

    if not (sw.available() and torch.cuda.get_device_capability()[0] == 9):
        pytest.skip("Gluon wgmma path: SM90 with triton.experimental.gluon only")
    g = _gen(1377)
    e, d, f, t, k = 8, 256, 128, 9, 4

    def stack(n, kk, lo, hi):
        w = torch.randint(0, 256, (e, n, kk // 2), generator=g, dtype=torch.uint8)
        return w, torch.randint(lo, hi, (e, n, kk // 32), generator=g, dtype=torch.uint8).view(torch.float8_e8m0fnu)

    # up-projection scales across the whole range (products stay finite: x is small), down scales moderate
    ws = [*stack(f, d, 0, 255), *stack(f, d, 0, 255), *stack(d, f, 100, 140)]
    x = (torch.randn(t, d, generator=g) * 2.0 ** -100).bfloat16()
    ids, w = _routing(t, k, e, "rand", g)
    ref = experts_mxfp4(x, w, ids, *ws, 1e30)
    cu = [a.cuda() for a in [x, w, ids] + ws]
    assert not sw.scales_allow_fast(cu[4], cu[6], cu[8])
    poison()
    out = sw.swap_mxfp4(*cu, 1e30)
    fin = torch.isfinite(ref.float())
    close(out.cpu()[fin], ref[fin], 3e-2, 3e-2)
