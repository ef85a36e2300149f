"""MXFP4 expert stacks in core's word layout on the GPU (``mxfp4_layout``; SM90 with Gluon): the layout op
repacks where the swap kernels read the words, and ``moe.experts_mxfp4`` on the repacked stacks equals the call on
the checkpoint stacks bit for bit on every path it takes (the paired and one-warpgroup swap kernels, graph replays,
and the paths that unpack: split-K below the swap range, dequant-once above it, the batch-invariant launch, aten's
grouped GEMMs)."""
from __future__ import annotations

import pytest
import torch

from deepinfer_nvidia.tests.test_conformance import _gen, _mxfp4_stacks, _routing, poison


def _kernels():
    from deepinfer_nvidia.kernels import gluon_moe_swap as sw
    from deepinfer_nvidia.kernels import mxfp4_layout, triton_moe

    if not (sw.available() and torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9):
        pytest.skip("the word layout is made for the Gluon swap kernels: SM90 with triton.experimental.gluon only")
    return mxfp4_layout, triton_moe


def _operands(seed: int, t: int, e: int, d: int, f: int, k: int = 6):
    ws = [a.cuda() for a in _mxfp4_stacks(e, d, f, 900 + d + f)]
    g = _gen(seed)
    x = torch.randn(t, d, generator=g).bfloat16().cuda()
    ids, w = (a.cuda() for a in _routing(t, k, e, "rand", g))
    return x, w, ids, ws


def test_layout_op_repacks_on_sm90_and_keeps_the_codes():
    from deepinfer_core.kernels.ops.mxfp4_words import expert_bytes

    layout, _ = _kernels()
    *_, ws = _operands(1, 1, 4, 256, 128)
    out = layout.experts_mxfp4_layout(*[a.clone() for a in ws])
    assert [o.dtype for o in out[::2]] == [torch.int32] * 3
    for i, (o, w) in enumerate(zip(out, ws)):
        assert torch.equal(expert_bytes(o) if i % 2 == 0 else o, w), i
    layout.WORD_LAYOUT = False
    try:
        assert all(o is w for o, w in zip(layout.experts_mxfp4_layout(*ws), ws))  # the knob keeps them as given
    finally:
        layout.WORD_LAYOUT = True


@pytest.mark.parametrize("t", [1, 2, 3, 8, 64, 300])
@pytest.mark.parametrize("d,f", [(5120, 2304), (640, 384)])
def test_word_layout_bit_equal_on_the_swap_paths(t, d, f):
    layout, tm = _kernels()
    x, w, ids, ws = _operands(3000 + t, t, 16, d, f)
    packed = layout.experts_mxfp4_layout(*[a.clone() for a in ws])  # it repacks its inputs in place
    ref = tm.moe_experts_mxfp4(x, w, ids, *ws, 10.0)
    poison()
    out = tm.moe_experts_mxfp4(x, w, ids, *packed, 10.0)
    assert torch.isfinite(out).all() and torch.equal(out, ref), (out.float() - ref.float()).abs().max()


def test_word_layout_in_graph_replays_with_fresh_routing():
    layout, tm = _kernels()
    x, w, ids, ws = _operands(41, 1, 16, 5120, 2304)
    packed = layout.experts_mxfp4_layout(*[a.clone() for a in ws])  # it repacks its inputs in place
    tm.moe_experts_mxfp4(x, w, ids, *packed, 10.0)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = tm.moe_experts_mxfp4(x, w, ids, *packed, 10.0)
    g = _gen(42)
    for _ in range(3):
        x.copy_(torch.randn(x.shape, generator=g).bfloat16())
        new_ids, new_w = _routing(1, 6, 16, "rand", g)
        ids.copy_(new_ids)
        w.copy_(new_w)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, tm.moe_experts_mxfp4(x, w, ids, *ws, 10.0))


@pytest.mark.parametrize("path", ["splitk", "dequant_once", "batch_invariant", "aten"])
def test_word_layout_on_the_unpacking_paths(path, monkeypatch):
    from deepinfer_nvidia.kernels import aten_ops
    from deepinfer_nvidia.kernels import gluon_moe_swap as sw

    layout, tm = _kernels()
    x, w, ids, ws = _operands(77, 5, 16, 640, 384)
    packed = layout.experts_mxfp4_layout(*[a.clone() for a in ws])  # it repacks its inputs in place
    if path == "splitk":  # below the swap range
        monkeypatch.setattr(sw, "SWAP_MIN_PAIRS", 1 << 20)
        call = tm.moe_experts_mxfp4
    elif path == "dequant_once":
        monkeypatch.setattr(tm, "DEQUANT_PAIRS", 1)
        call = tm.moe_experts_mxfp4
    elif path == "batch_invariant":
        call = tm.moe_experts_mxfp4_bi
    else:
        call = aten_ops.moe_experts_mxfp4
    ref = call(x, w, ids, *ws, 10.0)
    out = call(x, w, ids, *packed, 10.0)
    again = call(x, w, ids, *ws, 10.0)
    if torch.equal(again, ref):  # a path that repeats its bits must give them on the word layout too
        assert torch.equal(out, ref), (out.float() - ref.float()).abs().max()
    else:  # cuBLAS's grouped GEMM (aten) may not repeat its last bits run to run (4.8e-7 apart on an H100, pass40c)
        assert path == "aten" and torch.allclose(out, ref, rtol=0, atol=2 * (again - ref).abs().max().item())


def test_mixed_layouts_are_refused():
    from deepinfer_core.kernels.ops.quant import QuantFormatError

    layout, tm = _kernels()
    x, w, ids, ws = _operands(5, 2, 4, 256, 128)
    packed = layout.experts_mxfp4_layout(*[a.clone() for a in ws])  # it repacks its inputs in place
    with pytest.raises(QuantFormatError, match="share one layout"):
        tm.moe_experts_mxfp4(x, w, ids, packed[0], ws[1], ws[2], ws[3], ws[4], ws[5], 10.0)


def test_in_place_kernel_matches_the_torch_repack():
    from deepinfer_core.kernels.ops.mxfp4_words import pack_words
    from deepinfer_nvidia.kernels.triton_words import pack_words_inplace

    _kernels()
    g = torch.Generator(device="cuda").manual_seed(3)
    for shape in [(3, 5, 8), (7, 2304, 2560), (1, 1, 4)]:
        w = torch.randint(0, 256, shape, generator=g, device="cuda", dtype=torch.uint8)
        want = pack_words(w)
        ptr = w.data_ptr()
        out = pack_words_inplace(w)
        assert out.data_ptr() == ptr and torch.equal(out.view(torch.uint8), want), shape
