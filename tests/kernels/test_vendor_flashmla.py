"""The ``flashmla`` provider of ``attention.sparse_sink`` (``deepinfer_nvidia/kernels/flashmla.py``) on the CPU.

FlashMLA is not installed anywhere in this project, so the adapter's marshalling (flat KV workspace, int32 rows,
head and top-k padding, sinks) is run against a torch model of ``flash_mla_sparse_fwd``'s documented contract
(``vendor_contracts.py``) and compared with the op's reference; and the provider's fallback (CPU operands ->
the Triton wrapper -> the reference) is checked as it runs here.
"""
from __future__ import annotations

import pytest
import torch

from deepinfer_core.kernels.ops.attention import sparse_attention_sink
from deepinfer_nvidia.kernels import flashmla
from tests.kernels import vendor_contracts

D = 512


def _case(t, h, sa, na, sb, nb, seed, empty_row=False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(t, h, D, generator=g).to(torch.bfloat16)
    kv_a = torch.randn(sa, D, generator=g).to(torch.bfloat16)
    idx_a = torch.randint(-1, sa, (t, na), generator=g)
    kv_b = torch.randn(sb, D, generator=g).to(torch.bfloat16) if sb else None
    idx_b = torch.randint(-1, sb, (t, nb), generator=g) if sb else None
    if empty_row:  # a token that sees no slot at all: the op's definition gives zeros
        idx_a[0] = -1
        if idx_b is not None:
            idx_b[0] = -1
    sinks = torch.randn(h, generator=g).float()
    return q, kv_a, idx_a, kv_b, idx_b, sinks, D ** -0.5


@pytest.mark.parametrize("shape", [
    (3, 64, 40, 8, 0, 0),      # one cache: the cache itself, no copy; 64 heads as they are
    (5, 16, 64, 12, 48, 5),    # T*N = 85 < 112 cache rows: per-token gathered workspace; 16 heads padded to 64
    (40, 128, 20, 6, 10, 4),   # T*N = 400 > 30: the caches end to end; 128 heads
    (9, 100, 33, 130, 21, 7),  # 137 slots: top-k padded to 256; 100 heads padded to 128
])
def test_adapter_on_the_documented_contract_matches_the_reference(shape):
    args = _case(*shape, seed=sum(shape), empty_row=True)
    got = flashmla.call_sparse_fwd(vendor_contracts.flash_mla_sparse_fwd, *args)
    want = sparse_attention_sink(*args)
    assert got.dtype == torch.bfloat16 and got.shape == want.shape
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
    assert bool((got[0] == 0).all())


def test_workspace_choice_and_index_spaces():
    q, kv_a, idx_a, kv_b, idx_b, *_ = _case(4, 8, 50, 3, 60, 2, seed=1)
    kv, rows = flashmla.flat_kv_and_indices(kv_a, idx_a, kv_b, idx_b)
    assert kv.shape == (4 * 5, D) and rows.dtype == torch.int32  # 20 gathered rows < 110 cache rows
    q2, kv_a2, idx_a2, kv_b2, idx_b2, *_ = _case(30, 8, 5, 3, 6, 2, seed=2)
    kv2, rows2 = flashmla.flat_kv_and_indices(kv_a2, idx_a2, kv_b2, idx_b2)
    assert kv2.shape == (11, D)  # 11 cache rows < 150 gathered
    for kvx, rx, ia, ib, ka, kb in ((kv, rows, idx_a, idx_b, kv_a, kv_b), (kv2, rows2, idx_a2, idx_b2, kv_a2, kv_b2)):
        want = torch.cat([torch.where((ia >= 0)[..., None], ka[ia.clamp(min=0)], 0),
                          torch.where((ib >= 0)[..., None], kb[ib.clamp(min=0)], 0)], dim=1)
        got = torch.where((rx >= 0)[..., None], kvx[rx.clamp(min=0).long()], 0)
        assert torch.equal(got, want)
        assert torch.equal(rx < 0, torch.cat([ia < 0, ib < 0], dim=1))


def test_not_taken_off_a_gpu_and_the_fallback_is_the_reference():
    args = _case(3, 8, 20, 4, 10, 3, seed=3)
    assert not flashmla.supports(*args)  # CPU tensors (and no flash_mla here)
    torch.testing.assert_close(flashmla.sparse_sink(*args), sparse_attention_sink(*args), atol=0, rtol=0)


def test_a_contract_violation_in_the_adapter_would_be_caught():
    # the model asserts what the library asserts: an unpadded head count must not reach it
    q, kv_a, idx_a, *_ = _case(2, 16, 10, 128, 0, 0, seed=4)
    with pytest.raises(AssertionError):
        vendor_contracts.flash_mla_sparse_fwd(q, kv_a.unsqueeze(1), idx_a.to(torch.int32).unsqueeze(1), 1.0)
