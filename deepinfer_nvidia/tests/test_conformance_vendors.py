"""FlashMLA and DeepGEMM providers against their definitions on an SM100 GPU with the libraries installed.

NEVER RUN in this project: its one GPU is an SM90 H200 without either library (``docs/vendor_kernels.md``). The
CPU tests (``tests/kernels/test_vendor_*.py``) check the same adapters against torch models of the libraries'
documented contracts; this file is what a machine that has them runs:
``python3 -m pytest -q deepinfer_nvidia/tests/test_conformance_vendors.py``.
"""
from __future__ import annotations

import pytest
import torch

from deepinfer_nvidia.kernels.vendors import importable

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 10,
                                reason="needs an SM100 GPU")


def _qdq(x):
    from deepinfer_nvidia.kernels.deepgemm import dequantize_rows, quantize_rows

    return dequantize_rows(*quantize_rows(x)).to(x.dtype)


@pytest.mark.skipif(not importable("flash_mla"), reason="flash_mla is not installed")
@pytest.mark.parametrize("t,h,na,nb", [(1, 64, 128, 512), (4, 64, 128, 0), (200, 128, 128, 64), (3, 16, 128, 32)])
def test_flashmla_sparse_sink(t, h, na, nb):
    from deepinfer_core.kernels.ops.attention import sparse_attention_sink
    from deepinfer_nvidia.kernels import flashmla

    g = torch.Generator().manual_seed(t + h + na + nb)
    d, sa, sb = 512, 1024, 2048
    q = torch.randn(t, h, d, generator=g).bfloat16()
    kv_a = torch.randn(sa, d, generator=g).bfloat16()
    kv_b = torch.randn(sb, d, generator=g).bfloat16() if nb else None
    idx_a = torch.randint(-1, sa, (t, na), generator=g)
    idx_b = torch.randint(-1, sb, (t, nb), generator=g) if nb else None
    idx_a[0] = -1
    if nb:
        idx_b[0] = -1
    sinks = torch.randn(h, generator=g)
    args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in (q, kv_a, idx_a, kv_b, idx_b, sinks, d ** -0.5)]
    assert flashmla.supports(*args)
    out = flashmla.sparse_sink(*args).float().cpu()
    ref = sparse_attention_sink(q, kv_a, idx_a, kv_b, idx_b, sinks, d ** -0.5).float()
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)


@pytest.mark.skipif(not importable("deep_gemm"), reason="deep_gemm is not installed")
@pytest.mark.parametrize("t,n,k", [(1, 1024, 5120), (64, 5120, 1024), (4096, 512, 5120)])
def test_deepgemm_fp8_block(t, n, k):
    from deepinfer_core.kernels.ops.gemm import fp8_block
    from deepinfer_core.kernels.ops.quant import quant_fp8_block
    from deepinfer_nvidia.kernels import deepgemm

    g = torch.Generator().manual_seed(t + n)
    x = torch.randn(t, k, generator=g).bfloat16().cuda()
    wq, ws = quant_fp8_block(torch.randn(n, k, generator=g) * 0.02, (128, 128), scale_fmt="ue8m0")
    wq, ws = wq.cuda(), ws.cuda()
    assert deepgemm.supports_fp8(x, wq, ws, (128, 128))
    out = deepgemm.gemm_fp8_block(x, wq, ws, (128, 128)).float()
    torch.testing.assert_close(out, fp8_block(_qdq(x), wq, ws, (128, 128)).float(), atol=2e-2, rtol=2e-2)


@pytest.mark.skipif(not importable("deep_gemm"), reason="deep_gemm is not installed")
def test_deepgemm_experts_mxfp4_prefill_size():
    """2048 pairs over 16 experts (taken: 128 a mean expert); the CPU test checks the FP8 rounding of both
    activations exactly, here the output is held to the bf16-activation reference within 5% (rel. norm)."""
    from deepinfer_core.kernels.ops.moe import experts_mxfp4
    from deepinfer_core.kernels.ops.quant import quant_mxfp4
    from deepinfer_nvidia.kernels import deepgemm

    g = torch.Generator().manual_seed(0)
    t, k, e, d, f = 512, 4, 16, 1024, 512
    x = torch.randn(t, d, generator=g).bfloat16()
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
    weights = torch.rand(t, k, generator=g)
    stacks = []
    for rows, cols in ((f, d), (f, d), (d, f)):
        packs = [quant_mxfp4(torch.randn(rows, cols, generator=g) * 0.05) for _ in range(e)]
        stacks += [torch.stack([p for p, _ in packs]), torch.stack([s for _, s in packs])]
    cuda = [a.cuda() for a in (x, weights, ids, *stacks)]
    assert deepgemm.supports_experts(*cuda, 7.0)
    out = deepgemm.moe_experts_mxfp4(*cuda, 7.0).float().cpu()
    ref = experts_mxfp4(x, weights, ids, *stacks, 7.0).float()
    assert torch.isfinite(out).all()
    assert float((out - ref).norm() / ref.norm()) < 0.05
