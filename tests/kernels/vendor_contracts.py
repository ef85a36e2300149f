"""Torch models of the documented contracts of FlashMLA's and DeepGEMM's entry points that the ``flashmla`` and
``deepgemm`` adapters call (``deepinfer_nvidia/kernels/flashmla.py``, ``deepgemm.py``).

These are NOT the libraries (neither is installed on any machine of this project). Each function states the
preconditions the library asserts (dtypes, ranks, head counts, alignment) and computes what the library's own
reference computes, from FlashMLA 9241ae3 (``flash_mla/flash_mla_interface.py``, ``tests/ref.py``) and DeepGEMM
54e2261 (``csrc/apis/gemm.hpp``, ``csrc/apis/layout.hpp``, ``tests/generators.py``). They let the CPU tests
check the adapters' marshalling (layouts, padding, index spaces, scales) without a GPU; whether the real
kernels agree is for a machine that has them.
"""
from __future__ import annotations

import torch

from deepinfer_core.kernels.ops.quant import dequant_mxfp4, float_to_ue8m0


# -- FlashMLA ---------------------------------------------------------------------------------------
def flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v=512, attn_sink=None, topk_length=None):
    """q [s_q, h_q, d_qk] bf16 (h_q 64 or 128, d_qk 512 or 576), kv [s_kv, 1, d_qk] bf16, indices
    [s_q, 1, topk] int32 (rows of kv; -1 or >= s_kv: none; topk a multiple of 128), d_v 512, attn_sink fp32 [h_q]
    -> (out [s_q, h_q, d_v] bf16, max_logits [s_q, h_q] fp32, lse [s_q, h_q] fp32, natural log).
    A row with no valid index: out 0, max_logits -inf, lse +inf. The sink scales out by
    exp(lse) / (exp(lse) + exp(sink)) and leaves lse as it is."""
    s_q, h_q, d_qk = q.shape
    assert q.dtype == torch.bfloat16 and kv.dtype == torch.bfloat16 and q.stride(-1) == 1
    assert h_q in (64, 128) and d_qk in (512, 576) and d_v == 512
    assert kv.dim() == 3 and kv.shape[1] == 1 and kv.shape[2] == d_qk
    assert indices.dtype == torch.int32 and indices.shape[:2] == (s_q, 1) and indices.shape[2] % 128 == 0
    assert attn_sink is None or (attn_sink.dtype == torch.float32 and attn_sink.shape == (h_q,))
    assert topk_length is None
    s_kv = kv.shape[0]
    idx = indices[:, 0].long()
    ok = (idx >= 0) & (idx < s_kv)
    rows = kv[:, 0].float()[idx.clamp(0, s_kv - 1)]  # [s_q, topk, d_qk]
    logits = torch.einsum("shd,std->sht", q.float(), rows) * sm_scale
    logits = logits.masked_fill(~ok[:, None, :], float("-inf"))
    max_logits = logits.amax(dim=-1)
    lse = torch.logsumexp(logits, dim=-1)
    p = torch.exp(logits - torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)[..., None])
    out = torch.einsum("sht,std->shd", p, rows[..., :d_v])
    none = ~ok.any(dim=1)
    lse = torch.where(none[:, None], torch.full_like(lse, float("inf")), lse)
    out = torch.where(none[:, None, None], torch.zeros_like(out), out)
    if attn_sink is not None:
        out = out / (1 + torch.exp(attn_sink[None, :] - lse))[..., None]
    return out.to(torch.bfloat16), max_logits, lse


# -- DeepGEMM ---------------------------------------------------------------------------------------
def _is_pow2(s: torch.Tensor) -> bool:
    m, _ = torch.frexp(s)
    return bool(((m == 0.5) & (s > 0)).all())


def _deq_rows(a: torch.Tensor, sfa: torch.Tensor, gran: int) -> torch.Tensor:
    m, k = a.shape
    assert sfa.dtype == torch.float32 and sfa.shape == (m, -(-k // gran)) and _is_pow2(sfa)
    return (a.float().view(m, k // gran, gran) * sfa[..., None]).view(m, k)


def fp8_gemm_nt(a, b, d, c=None, recipe=None, compiled_dims="nk", disable_ue8m0_cast=False):
    """d [M, N] bf16 (row-major, written in place) = (a, sfa) @ (b, sfb)^T. a [M, K] e4m3 with fp32 sfa
    [M, K/128]; b [N, K] e4m3 with fp32 sfb [N/128, K/128]. SM100 packs fp32 scales to UE8M0, asserting they are
    powers of two."""
    (aq, sfa), (bq, sfb) = a, b
    assert aq.dtype == torch.float8_e4m3fn and bq.dtype == torch.float8_e4m3fn and c is None
    assert d.dtype == torch.bfloat16 and d.stride(-1) == 1 and d.shape == (aq.shape[0], bq.shape[0])
    n, k = bq.shape
    assert sfb.dtype == torch.float32 and sfb.shape == (-(-n // 128), -(-k // 128)) and _is_pow2(sfb)
    w = bq.float() * sfb.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
    d.copy_((_deq_rows(aq, sfa, 128) @ w.T).to(d.dtype))


def get_mk_alignment_for_contiguous_layout() -> int:
    return 128


def transform_sf_into_required_layout(sf, mn, k, recipe, num_groups=None, is_sfa=None, disable_ue8m0_cast=False):
    """The library packs fp32 power-of-two scales [G, MN, K/32] into its UE8M0 int32 layout; the model keeps the
    fp32 tensor (only the model's GEMM reads it) after the library's checks."""
    assert recipe == (1, 32) and is_sfa is None and sf.dtype == torch.float32
    assert sf.shape == (num_groups, mn, -(-k // 32)) and _is_pow2(sf)
    return ("packed-ue8m0", sf)


def m_grouped_fp8_fp4_gemm_nt_contiguous(a, b, d, grouped_layout, recipe=None, recipe_a=None, recipe_b=None,
                                         compiled_dims="nk", disable_ue8m0_cast=False, use_psum_layout=False):
    """d [M, N] bf16 = per 128-row block, a's rows times expert ``grouped_layout[block start]``'s FP4 weight.
    a [M, K] e4m3 with fp32 sfa [M, K/128]; b (int8 [G, N, K/2] two e2m1 a byte, low nibble first; scales
    from ``transform_sf_into_required_layout``); grouped_layout int32 [M], M a multiple of 128. A block whose
    first row is -1 is skipped on SM90 and computed as expert 0 on SM100: the model writes NaN there, so an
    adapter that reads those rows fails."""
    (aq, sfa), (bq, (tag, sfb)) = a, b
    assert recipe is None and recipe_a == (1, 128) and recipe_b == (1, 32) and tag == "packed-ue8m0"
    assert aq.dtype == torch.float8_e4m3fn and bq.dtype == torch.int8 and bq.dim() == 3
    m, k = aq.shape
    g, n, half = bq.shape
    assert 2 * half == k and d.dtype == torch.bfloat16 and d.shape == (m, n) and d.is_contiguous()
    assert grouped_layout.dtype == torch.int32 and grouped_layout.shape == (m,) and m % 128 == 0
    x = _deq_rows(aq, sfa, 128)
    for blk in range(m // 128):
        rows = slice(blk * 128, (blk + 1) * 128)
        e = int(grouped_layout[blk * 128])
        if e < 0:
            d[rows] = float("nan")
            continue
        w = dequant_mxfp4(bq[e], float_to_ue8m0(sfb[e]))
        d[rows] = (x[rows] @ w.T).to(d.dtype)
