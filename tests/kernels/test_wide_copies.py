"""``deepinfer_nvidia/kernels/wide_copies.py``: the fp32 copy of a half-precision weight that ``gemm.dense_wide``
multiplies above its GEMV rows is made once and reused, remade when the weight changes in place, dropped with the
weight, and never kept from inside a CUDA-graph capture (device tests: ``test_conformance_dense_gemv.py``)."""
from __future__ import annotations

import gc

import pytest
import torch

wc = pytest.importorskip("deepinfer_nvidia.kernels.wide_copies")


def test_a_copy_is_made_once_and_reused():
    w = torch.randn(8, 16).bfloat16()
    before = wc.kept()
    a = wc.widened(w, torch.float32)
    assert a.dtype == torch.float32 and torch.equal(a, w.float())
    assert wc.widened(w, torch.float32) is a and wc.kept() == before + 1
    full = torch.randn(8, 16)
    assert wc.widened(full, torch.float32) is full  # nothing to widen: the weight itself, nothing kept
    assert wc.kept() == before + 1


def test_an_in_place_change_remakes_the_copy():
    w = torch.randn(4, 4).bfloat16()
    a = wc.widened(w, torch.float32)
    w.mul_(2)
    b = wc.widened(w, torch.float32)
    assert b is not a and torch.equal(b, w.float()) and not torch.equal(a, b)


def test_the_copy_goes_with_its_weight():
    w = torch.randn(4, 4).bfloat16()
    wc.widened(w, torch.float32)
    n = wc.kept()
    del w
    gc.collect()
    assert wc.kept() == n - 1


def test_inference_tensors_and_the_switch(monkeypatch):
    with torch.inference_mode():
        w = torch.randn(4, 4).half()  # no version counter
        a = wc.widened(w, torch.float32)
        assert wc.widened(w, torch.float32) is a and torch.equal(a, w.float())
    monkeypatch.setattr(wc, "WIDE_COPIES", False)
    v = torch.randn(4, 4).bfloat16()
    n = wc.kept()
    assert wc.widened(v, torch.float32) is not wc.widened(v, torch.float32) and wc.kept() == n
