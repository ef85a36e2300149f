"""``gemm.dense``'s opt-in split-K path in the ``aten`` provider (``DEEPINFER_NV_DENSE_SPLITK``,
``deepinfer_nvidia/kernels/aten_ops.py``): the batched K-slice GEMM against the fp64 product, which operands it
takes, and the knob's parsing. On the CPU: the same torch calls cuBLAS serves on a GPU."""
from __future__ import annotations

import pytest
import torch

aten_ops = pytest.importorskip("deepinfer_nvidia.kernels.aten_ops")


@pytest.mark.parametrize("m,n,k,splits", [(32, 256, 4096, 16), (5, 100, 2048, 8), (64, 1024, 4096, 4),
                                          (8, 3, 6144, 32)])
def test_splitk_matches_the_product(m, n, k, splits):
    g = torch.Generator().manual_seed(m + n)
    x = torch.randn(m, k, generator=g)
    w = torch.randn(n, k, generator=g) / k ** 0.5
    got = aten_ops.splitk_mm(x, w, splits)
    exact = x.double() @ w.double().t()
    assert got.dtype == torch.float32 and got.shape == (m, n)
    assert (got.double() - exact).abs().max() <= 1e-5 * max(1.0, exact.abs().max().item())


def test_splitk_reads_strided_column_slices():
    """Operands that are column slices of wider matrices (row stride > K), as views of packed weights are."""
    g = torch.Generator().manual_seed(1)
    big_x, big_w = torch.randn(16, 4608, generator=g), torch.randn(64, 4608, generator=g)
    x, w = big_x[:, 256:4352], big_w[:, 256:4352]
    torch.testing.assert_close(aten_ops.splitk_mm(x, w, 8), x @ w.t(), rtol=1e-5, atol=1e-4)


def test_operands_it_takes():
    x, w = torch.zeros(32, 4096), torch.zeros(256, 4096)
    assert aten_ops.splitk_takes(x, w, 16)
    assert not aten_ops.splitk_takes(x, w, 0) and not aten_ops.splitk_takes(x, w, 1)  # off
    assert not aten_ops.splitk_takes(x[:4], w, 16)  # 1-4 rows: the Triton GEMV's
    assert not aten_ops.splitk_takes(torch.zeros(65, 4096), w, 16)  # rows: one GEMM has programs enough
    assert not aten_ops.splitk_takes(x.bfloat16(), w.bfloat16(), 16)  # fp32 only
    assert not aten_ops.splitk_takes(x[:, :1024], w[:, :1024], 16)  # K too short
    assert not aten_ops.splitk_takes(x, w, 3)  # K not divisible
    assert not aten_ops.splitk_takes(x, torch.zeros(5000, 4096), 16)  # weight too large


@pytest.mark.parametrize("value,want", [("", 0), ("0", 0), ("1", 1), ("16", 16)])
def test_knob(monkeypatch, value, want):
    monkeypatch.setenv("DEEPINFER_NV_DENSE_SPLITK", value)
    assert aten_ops.splitk_splits() == want


@pytest.mark.parametrize("value", ["-1", "on", "33", "2.5"])
def test_knob_refuses_other_values(monkeypatch, value):
    monkeypatch.setenv("DEEPINFER_NV_DENSE_SPLITK", value)
    with pytest.raises(ValueError, match="DEEPINFER_NV_DENSE_SPLITK must be an integer 0-32"):
        aten_ops.splitk_splits()
