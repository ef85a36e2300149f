"""The swap experts on two warpgroups a program (``gluon_swap_pair``, SM90 only) against the reference on the GPU:
odd and even K-tile counts (the second warpgroup's last tile masked or not), 1-17 tokens including every pair on
one expert (several 8-pair blocks), both decodes, graph replays with fresh inputs, V4.1's widths against the
one-warpgroup kernel, the default policy (1 token takes it, 64 do not), and the down launch's early weight requests
under PDL (``PAIR_EARLY_WEIGHTS``) in graph replays. Outputs are poisoned with NaN first."""
from __future__ import annotations

import pytest
import torch

from deepinfer_nvidia.tests.test_conformance import _gen, _mxfp4_stacks, _routing, close, poison


def _swap():
    from deepinfer_nvidia.kernels import gluon_moe_swap as sw

    if not (sw.available() and torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9):
        pytest.skip("Gluon wgmma path: SM90 with triton.experimental.gluon only")
    return sw


def _case(seed: int, t: int, k: int, route: str, e: int, d: int, f: int):
    """(CPU reference with limit 1.0, operands on the GPU) for ``t`` tokens of ``k`` pairs over ``e`` experts."""
    from deepinfer_core.kernels.ops.moe import experts_mxfp4

    ws = _mxfp4_stacks(e, d, f, 700 + d + f)
    g = _gen(seed)
    x = torch.randn(t, d, generator=g).bfloat16()
    ids, w = _routing(t, k, e, route, g)
    return experts_mxfp4(x, w, ids, *ws, 1.0), [a.cuda() for a in [x, w, ids] + ws]


def _model_width(seed: int, t: int) -> tuple:
    """(x [t, 5120] bf16, weights, ids [t, 6], stacks) on the GPU: V4.1's widths (D 5120, F 2304), 16 experts."""
    e, d, f = 16, 5120, 2304
    ws = [a.cuda() for a in _mxfp4_stacks(e, d, f, 800)]
    g = _gen(seed)
    x = torch.randn(t, d, generator=g).bfloat16().cuda()
    ids, w = (a.cuda() for a in _routing(t, 6, e, "rand", g))
    return x, w, ids, ws


@pytest.mark.parametrize("d,f", [(640, 384), (512, 256)])  # 5 and 3 K tiles (odd), 4 and 2 (even)
@pytest.mark.parametrize("t,k,route", [(1, 6, "rand"), (2, 6, "rand"), (3, 8, "skew"), (8, 6, "one"),
                                       (17, 3, "rand")])
@pytest.mark.parametrize("safe", [None, True])
def test_swap_pair_against_reference(t, k, route, d, f, safe):
    sw = _swap()
    ref, cu = _case(2500 + t * 10 + k, t, k, route, 16, d, f)
    poison()
    out = sw.swap_mxfp4(*cu, 1.0, safe=safe, paired=True)
    close(out, ref, 3e-2, 3e-2)


def _replays_match(sw, x, w, ids, stacks, seed: int, eager, e: int = 16) -> None:
    """Capture ``swap_mxfp4(paired=True)`` on ``x``, ``w``, ``ids`` (updated in place) once, then replay it three times
    on fresh activations and routings (over ``e`` experts): each replay must equal ``eager(x, w, ids)`` bit for bit."""
    t, d = x.shape
    sw.swap_mxfp4(x, w, ids, *stacks, 1.0, paired=True)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = sw.swap_mxfp4(x, w, ids, *stacks, 1.0, paired=True)
    g = _gen(seed)
    for _ in range(3):
        x.copy_(torch.randn(t, d, generator=g).bfloat16())
        nid, nw = _routing(t, ids.shape[1], e, "rand", g)
        ids.copy_(nid)
        w.copy_(nw)
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(y, eager(x, w, ids), rtol=0, atol=0)


def test_swap_pair_graph_replay():
    """Captured once, replayed on fresh inputs and routings: each replay matches an eager call bit for bit."""
    sw = _swap()
    _, cu = _case(2600, 1, 6, "rand", 16, 640, 384)
    x, w, ids = (a.clone() for a in cu[:3])
    _replays_match(sw, x, w, ids, cu[3:], 2601, lambda *a: sw.swap_mxfp4(*a, *cu[3:], 1.0, paired=True))


@pytest.mark.parametrize("t", [1, 2])
def test_swap_pair_model_width(t):
    """V4.1's widths (D 5120, F 2304: 40 and 18 K tiles), 16 experts: within bf16 rounding of the one-warpgroup
    kernel (the fp32 sums differ only in order)."""
    sw = _swap()
    x, w, ids, ws = _model_width(2700 + t, t)
    poison()
    out = sw.swap_mxfp4(x, w, ids, *ws, 1.0, paired=True)
    base = sw.swap_mxfp4(x, w, ids, *ws, 1.0, paired=False)
    close(out, base, 2e-2, 2e-2)


def test_swap_pair_default_policy(monkeypatch):
    """With no tile knob, 1 token at V4.1's widths takes the paired launches and 64 tokens do not; the
    ``PAIR_WARPGROUPS`` switch turns them off."""
    sw = _swap()
    from deepinfer_nvidia.kernels import gluon_swap_pair as gp

    calls = []
    real = gp.launch
    monkeypatch.setattr(gp, "launch", lambda *a, **kw: (calls.append(a[0]), real(*a, **kw))[1])
    e, d, f = 16, 5120, 2304
    ws = [a.cuda() for a in _mxfp4_stacks(e, d, f, 800)]
    g = _gen(2800)
    for t, expect in ((1, [True, False]), (64, [])):
        calls.clear()
        x = torch.randn(t, d, generator=g).bfloat16().cuda()
        ids, w = (a.cuda() for a in _routing(t, 6, e, "rand", g))
        sw.swap_mxfp4(x, w, ids, *ws, 1.0)
        assert calls == expect, (t, calls)
    monkeypatch.setattr(gp, "PAIR_WARPGROUPS", False)
    calls.clear()
    x = torch.randn(1, d, generator=g).bfloat16().cuda()
    ids, w = (a.cuda() for a in _routing(1, 6, e, "rand", g))
    sw.swap_mxfp4(x, w, ids, *ws, 1.0)
    assert calls == []


@pytest.mark.parametrize("t", [1, 3])
def test_swap_down_early_weights_replay(monkeypatch, t):
    """``PAIR_EARLY_WEIGHTS`` under PDL: the down launch asks for its first weight tiles, scale words, expert ids and
    pair rows before its wait. Captured once at V4.1's widths and replayed on fresh activations and routings (so
    every replay's ids are new when the down launch reads them early): each replay equals an eager call without
    the early requests bit for bit."""
    sw = _swap()
    from deepinfer_nvidia.kernels import gluon_swap_pair as gp
    from deepinfer_nvidia.kernels.triton_pdl import pdl_launch

    if not pdl_launch():
        pytest.skip("programmatic dependent launch is off (DEEPINFER_NV_PDL=0)")
    x0, w0, ids0, ws = _model_width(3500 + t, t)
    monkeypatch.setattr(gp, "PAIR_EARLY_WEIGHTS", True)

    def plain(*a):  # the same call without the early requests
        monkeypatch.setattr(gp, "PAIR_EARLY_WEIGHTS", False)
        out = sw.swap_mxfp4(*a, *ws, 1.0, paired=True)
        monkeypatch.setattr(gp, "PAIR_EARLY_WEIGHTS", True)
        return out

    _replays_match(sw, x0.clone(), w0.clone(), ids0.clone(), ws, 3600 + t, plain)

