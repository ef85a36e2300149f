"""The ``deepgemm`` provider (``deepinfer_nvidia/kernels/deepgemm.py``) and the vendor provider rule
(``kernels/vendors.py``, ``NvidiaPlatform.default_providers``) on the CPU.

DeepGEMM is not installed anywhere in this project: the adapters run against a torch model of its documented
contract (``vendor_contracts.py``). What they must equal is the op's reference applied to the activations the
provider quantises (``quantize_rows``: e4m3 per token and 128 columns, power-of-two scales), which is the
provider's stated numerics; how far that is from the bf16-activation definition is measured too.
"""
from __future__ import annotations

import types

import pytest
import torch

from deepinfer_core.kernels.ops.gemm import fp8_block, fp8_block_grouped
from deepinfer_core.kernels.ops.moe import clamped_swiglu, experts_mxfp4
from deepinfer_core.kernels.ops.quant import dequant_mxfp4, quant_fp8_block, quant_mxfp4
from deepinfer_core.kernels.registry import KernelRegistry
from deepinfer_nvidia.kernels import deepgemm, register, vendors
from deepinfer_nvidia.platform import _ProvidersByMode
from tests.kernels import vendor_contracts

DG = types.SimpleNamespace(**{n: getattr(vendor_contracts, n) for n in (
    "fp8_gemm_nt", "get_mk_alignment_for_contiguous_layout", "transform_sf_into_required_layout",
    "m_grouped_fp8_fp4_gemm_nt_contiguous")})


def _qdq(x: torch.Tensor) -> torch.Tensor:
    """x as the provider hands it to the tensor cores, rounded back to x's dtype."""
    return deepgemm.dequantize_rows(*deepgemm.quantize_rows(x)).to(x.dtype)


def test_quantize_rows_power_of_two_scales_and_bounded_error():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 384, generator=g) * torch.logspace(-3, 3, 7)[:, None]
    x[2, :128] = 0
    q, s = deepgemm.quantize_rows(x)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (7, 3)
    m, _ = torch.frexp(s)
    assert bool((m == 0.5).all()) and float(s[2, 0]) == 1.0
    assert float(q.float().abs().max()) <= 448
    err = (deepgemm.dequantize_rows(q, s) - x).abs().view(7, 3, 128).amax(-1)
    assert bool((err <= x.abs().view(7, 3, 128).amax(-1) * 2.0 ** -3).all())  # half an e4m3 ulp at worst


@pytest.mark.parametrize("t,n,k", [(1, 128, 256), (5, 256, 384), (33, 384, 128)])
def test_fp8_gemm_adapter_matches_the_reference_on_quantised_activations(t, n, k):
    g = torch.Generator().manual_seed(t + n + k)
    x = torch.randn(t, k, generator=g).to(torch.bfloat16)
    wq, ws = quant_fp8_block(torch.randn(n, k, generator=g) * 0.05, (128, 128), scale_fmt="ue8m0")
    got = deepgemm.call_fp8_gemm(DG.fp8_gemm_nt, x, wq, ws)
    torch.testing.assert_close(got.float(), fp8_block(_qdq(x), wq, ws, (128, 128)).float(), atol=2e-2, rtol=2e-2)
    exact = fp8_block(x, wq, ws, (128, 128)).float()  # the op's bf16-activation definition
    rel = float((got.float() - exact).norm() / exact.norm())
    assert 1e-3 < rel < 0.05, rel  # FP8 activation rounding: visible, and small


@pytest.mark.parametrize("t,groups,ng,kg", [(1, 2, 128, 256), (7, 4, 256, 128), (0, 2, 128, 128)])
def test_grouped_fp8_gemm_adapter_matches_the_reference_on_quantised_activations(t, groups, ng, kg):
    g = torch.Generator().manual_seed(t + groups + ng)
    x = torch.randn(t, groups * kg, generator=g).to(torch.bfloat16)
    wq, ws = quant_fp8_block(torch.randn(groups * ng, kg, generator=g) * 0.05, (128, 128), scale_fmt="ue8m0")
    got = deepgemm.call_fp8_gemm_grouped(DG.fp8_gemm_nt, x, wq, ws, groups)
    want = fp8_block_grouped(_qdq(x) if t else x, wq, ws, (128, 128), groups)
    assert got.shape == want.shape
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)


def _experts(e, f, d, seed):
    g = torch.Generator().manual_seed(seed)
    packs = [[quant_mxfp4(torch.randn(rows, cols, generator=g) * 0.1) for _ in range(e)]
             for rows, cols in ((f, d), (f, d), (d, f))]
    return [t for stack in packs for t in (torch.stack([p for p, _ in stack]), torch.stack([s for _, s in stack]))]


def _expected(x, weights, ids, w1, s1, w3, s3, w2, s2, limit):
    """Per pair, the reference's expert on the provider's quantised activations (x and the SwiGLU output)."""
    out = torch.zeros(x.shape, dtype=torch.float32)
    for t in range(ids.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            xe = _qdq(x[t:t + 1])
            gate = (xe.float() @ dequant_mxfp4(w1[e], s1[e]).T).to(x.dtype)
            up = (xe.float() @ dequant_mxfp4(w3[e], s3[e]).T).to(x.dtype)
            h = _qdq(clamped_swiglu(gate, up, limit))
            y = (h.float() @ dequant_mxfp4(w2[e], s2[e]).T).to(x.dtype)
            out[t] += y[0].float() * weights[t, j]
    return out.to(x.dtype)


@pytest.mark.parametrize("t,k,e", [(6, 2, 4), (20, 3, 8)])
def test_grouped_fp4_adapter_matches_the_reference_on_quantised_activations(t, k, e):
    d, f, limit = 256, 128, 7.0
    g = torch.Generator().manual_seed(t * k * e)
    x = torch.randn(t, d, generator=g).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
    weights = torch.rand(t, k, generator=g)
    stacks = _experts(e, f, d, seed=e)
    got = deepgemm.call_grouped(DG, x, weights, ids, *stacks, limit)
    assert bool(torch.isfinite(got).all())  # the model's NaN padding blocks never reach the output
    torch.testing.assert_close(got.float(), _expected(x, weights, ids, *stacks, limit).float(), atol=2e-2, rtol=2e-2)
    exact = experts_mxfp4(x, weights, ids, *stacks, limit).float()
    assert float((got.float() - exact).norm() / exact.norm()) < 0.05


def test_contiguous_layout_pads_every_expert_to_the_alignment():
    ids = torch.tensor([[3, 0], [3, 1], [0, 3]])
    pair, m_idx = deepgemm.contiguous_layout(ids, experts=5, alignment=4)
    assert pair.shape == (20,)  # (6 pairs + 5 experts * 3) // 4 * 4 rows: a static bound (3 blocks used)
    blocks = m_idx.view(-1, 4)
    assert blocks[:, 0].tolist()[:3] == [0, 1, 3] and bool((blocks[3:] == -1).all())
    for r in range(pair.numel()):  # every real row sits in its expert's block; padding rows carry -1 twice
        if pair[r] >= 0:
            assert int(m_idx[r]) == int(ids.reshape(-1)[pair[r]])
        else:
            assert int(m_idx[r]) == -1
    assert sorted(pair[pair >= 0].tolist()) == list(range(6))


def test_not_taken_off_a_gpu():
    x = torch.randn(2, 128).to(torch.bfloat16)
    wq, ws = quant_fp8_block(torch.randn(128, 128), (128, 128), scale_fmt="ue8m0")
    assert not deepgemm.supports_fp8(x, wq, ws, (128, 128))
    torch.testing.assert_close(deepgemm.gemm_fp8_block(x, wq, ws, (128, 128)), fp8_block(x, wq, ws, (128, 128)))
    assert not deepgemm.supports_fp8_grouped(x, wq, ws, (128, 128), 1)
    torch.testing.assert_close(deepgemm.gemm_fp8_block_grouped(x, wq, ws, (128, 128), 1),
                               fp8_block_grouped(x, wq, ws, (128, 128), 1))


@pytest.mark.parametrize("cap,env,present,want", [
    ((10, 0), {}, True, ("flashmla",)),
    ((10, 0), {"DEEPINFER_NV_DEEPGEMM": "1"}, True, ("flashmla", "deepgemm")),
    ((10, 0), {"DEEPINFER_NV_FLASHMLA": "0"}, True, ()),
    ((10, 0), {"DEEPINFER_NV_DEEPGEMM": "1"}, False, ()),
    ((9, 0), {"DEEPINFER_NV_DEEPGEMM": "1"}, True, ()),
    ((9, 0), {"DEEPINFER_NV_FLASHMLA": "1"}, True, ("flashmla",)),
])
def test_vendor_providers_rule(monkeypatch, cap, env, present, want):
    for name in ("DEEPINFER_NV_FLASHMLA", "DEEPINFER_NV_DEEPGEMM"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert vendors.vendor_providers(cap, has=lambda module: present) == want


def test_a_bad_knob_value_is_refused_by_name(monkeypatch):
    monkeypatch.setenv("DEEPINFER_NV_DEEPGEMM", "yes")
    with pytest.raises(ValueError, match="DEEPINFER_NV_DEEPGEMM must be 0 or 1"):
        vendors.vendor_providers((10, 0), has=lambda module: True)


def test_vendors_go_first_in_default_mode_only(monkeypatch):
    class Platform:
        default_providers = _ProvidersByMode(("triton", "aten"), ("triton_bi",))
        vendors = ("flashmla",)

    monkeypatch.delenv("DEEPINFER_BATCH_INVARIANT", raising=False)
    assert Platform().default_providers == ("flashmla", "triton", "aten")
    monkeypatch.setenv("DEEPINFER_BATCH_INVARIANT", "1")
    assert Platform().default_providers == ("triton_bi", "triton", "aten")
    reg = KernelRegistry()
    from deepinfer_core.kernels.ops import register_builtin_ops

    register_builtin_ops(reg)
    register(reg)
    assert "flashmla" in reg.providers("attention.sparse_sink")
    for op in ("gemm.fp8_block", "gemm.fp8_block_grouped", "moe.experts_mxfp4"):
        assert "deepgemm" in reg.providers(op)
    monkeypatch.delenv("DEEPINFER_BATCH_INVARIANT")
    monkeypatch.delenv("DEEPINFER_KERNELS", raising=False)  # the suite's conftest forces the references
    provider, _fn = reg.resolve("attention.sparse_sink", ("flashmla", "triton"))
    assert provider == "flashmla"


def test_scale_stacks_are_transformed_once_per_tensor():
    calls = []

    def transform(sf, mn, k, recipe, num_groups=None, is_sfa=None, disable_ue8m0_cast=False):
        calls.append(mn)
        return vendor_contracts.transform_sf_into_required_layout(sf, mn, k, recipe, num_groups)

    dg = types.SimpleNamespace(transform_sf_into_required_layout=transform)
    w1, s1, *_ = _experts(2, 128, 64, seed=5)
    first = deepgemm._packed_scales(dg, s1, 128, 64)
    assert deepgemm._packed_scales(dg, s1, 128, 64) is first and calls == [128]
    deepgemm._packed_scales(dg, s1.clone(), 128, 64)  # another tensor: its own entry
    assert calls == [128, 128]
