"""The balanced up launch of the paired swap experts (``gluon_swap_balanced``, SM90 only) on the GPU: against the
reference at odd and even K-tile counts (tiles split over two or three programs, tiles whole), both decodes, a
routing that leaves a block empty (the hash routers' repeated ids), V4.1's widths against the unbalanced launch,
graph replays with fresh routings bit-identical to eager calls, and the word layout bit-equal to the checkpoint's.
Outputs are poisoned with NaN first."""
from __future__ import annotations

import pytest
import torch

from deepinfer_nvidia.tests.test_conformance import _mxfp4_stacks, close, poison
from deepinfer_nvidia.tests.test_conformance_moe_swap_pair import _case, _model_width, _replays_match, _swap


@pytest.fixture
def balanced(monkeypatch):
    sw = _swap()
    from deepinfer_nvidia.kernels import gluon_swap_balanced as gb

    calls = []
    real = gb.launch_up
    monkeypatch.setattr(gb, "BALANCED", True)
    monkeypatch.setattr(gb, "launch_up", lambda *a, **kw: (calls.append(1), real(*a, **kw))[1])
    return sw, calls


@pytest.mark.parametrize("d,f", [(640, 384), (512, 256), (1280, 768)])  # 3, 2 and 5 steps a tile
@pytest.mark.parametrize("safe", [None, True])
def test_balanced_against_reference(balanced, d, f, safe):
    sw, calls = balanced
    ref, cu = _case(3100 + d + f, 1, 6, "rand", 16, d, f)
    poison()
    out = sw.swap_mxfp4(*cu, 1.0, safe=safe, paired=True)
    assert calls, "the balanced launch did not run"
    close(out, ref, 3e-2, 3e-2)


def test_balanced_with_an_empty_block(balanced):
    """Two of the token's six pairs on one expert: five live blocks of the six the launch covers."""
    sw, calls = balanced
    from deepinfer_core.kernels.ops.moe import experts_mxfp4

    e, d, f = 16, 640, 384
    ws = _mxfp4_stacks(e, d, f, 3200)
    x = torch.randn(1, d).bfloat16()
    ids = torch.tensor([[3, 3, 7, 1, 12, 9]])
    w = torch.rand(1, 6)
    ref = experts_mxfp4(x, w, ids, *ws, 1.0)
    poison()
    out = sw.swap_mxfp4(x.cuda(), w.cuda(), ids.cuda(), *[a.cuda() for a in ws], 1.0, paired=True)
    assert calls
    close(out, ref, 3e-2, 3e-2)


def test_balanced_model_width(balanced):
    """V4.1's widths (20 steps a tile, 17 units a program: tiles split over two programs): within bf16 rounding of
    the unbalanced paired launch (the fp32 sums differ only in order)."""
    sw, calls = balanced
    from deepinfer_nvidia.kernels import gluon_swap_balanced as gb

    x, w, ids, ws = _model_width(3300, 1)
    poison()
    out = sw.swap_mxfp4(x, w, ids, *ws, 1.0, paired=True)
    assert calls
    gb.BALANCED = False
    try:
        base = sw.swap_mxfp4(x, w, ids, *ws, 1.0, paired=True)
    finally:
        gb.BALANCED = True
    close(out, base, 2e-2, 2e-2)


@pytest.mark.parametrize("d,f", [(640, 384), (5120, 2304)])
def test_balanced_graph_replay(balanced, d, f):
    """Captured once, replayed on fresh inputs and routings: each replay equals an eager call bit for bit (the
    partials are added in segment order whoever arrives last, and the arrival counters are reset)."""
    sw, calls = balanced
    _, cu = _case(3400 + d, 1, 6, "rand", 16, d, f)
    x, w, ids = (a.clone() for a in cu[:3])
    _replays_match(sw, x, w, ids, cu[3:], 3401, lambda *a: sw.swap_mxfp4(*a, *cu[3:], 1.0, paired=True))
    assert calls


def test_balanced_word_layout_bit_equal(balanced):
    """Core's word layout of the stacks gives the checkpoint layout's output bit for bit on the balanced launch."""
    sw, calls = balanced
    from deepinfer_core.kernels.ops.mxfp4_words import pack_words

    x, w, ids, ws = _model_width(3500, 1)
    packed = list(ws)
    for i in (0, 2, 4):
        packed[i] = pack_words(ws[i])
    for safe in (False, True):
        ref = sw.swap_mxfp4(x, w, ids, *ws, 1.0, safe=safe, paired=True)
        out = sw.swap_mxfp4(x, w, ids, *packed, 1.0, safe=safe, paired=True, packed=True)
        assert torch.equal(out, ref), safe
    assert calls
