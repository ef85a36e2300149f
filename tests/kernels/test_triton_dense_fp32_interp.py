"""fp32 ``gemm.dense``'s Triton launch (``deepinfer_nvidia/kernels/triton_dense_fp32.py``) in Triton's CPU
interpreter against float64, on shapes whose edges cut every tile (M, N, K not multiples of the tiles), and
its routing: calls the kernel does not cover (too few rows, bf16, CPU tensors) run ``aten_ops.gemm_dense``.
The interpreter computes the dot in full fp32, so this checks the launch (tiles, masks, strides); the tf32x3
precision is checked on the GPU (``deepinfer_nvidia/tests/test_conformance_dense_fp32.py``)."""
from __future__ import annotations

import pytest
import torch

_INTERPRETED = r"""
import torch
from deepinfer_nvidia.kernels import triton_dense_fp32 as td

g = torch.Generator().manual_seed(3)
cases = 0
for m, n, k, tiles in ((37, 19, 70, (16, 16, 16, 4, 1)), (130, 129, 96, (64, 64, 32, 4, 2))):
    x = torch.randn(m, k + 5, generator=g)[:, 2:2 + k]  # a strided view: rows are k + 5 apart
    w = torch.randn(n, k, generator=g)
    y = td.gemm_dense_tf32x3(x, w, tiles=tiles, force_kernel=True)
    ref = (x.double() @ w.double().t()).float()
    assert y.dtype == torch.float32 and y.shape == (m, n)
    torch.testing.assert_close(y, ref, atol=1e-4, rtol=1e-4)
    cases += 1
print("INTERPRETED", cases)
"""


def test_dense_fp32_in_the_interpreter(run_interpreted):
    run_interpreted(_INTERPRETED, "INTERPRETED 2")


def test_uncovered_calls_run_the_aten_gemm(monkeypatch):
    pytest.importorskip("triton")
    from deepinfer_nvidia.kernels import aten_ops, triton_dense_fp32 as td

    calls = []
    real = aten_ops.gemm_dense
    monkeypatch.setattr(aten_ops, "gemm_dense", lambda x, w: calls.append(x.shape) or real(x, w))
    w = torch.randn(8, 16)
    for x in (torch.randn(4, 16), torch.randn(2048, 16).bfloat16()):
        assert not td.supports(x, w)
        y = td.gemm_dense_tf32x3(x, w)
        torch.testing.assert_close(y.float(), (x.float() @ w.to(x.dtype).float().t()), atol=0.1, rtol=2e-2)
    assert calls == [(4, 16), (2048, 16)]
    with pytest.raises(ValueError, match="K=16"):
        td.gemm_dense_tf32x3(torch.randn(4, 12), w)
