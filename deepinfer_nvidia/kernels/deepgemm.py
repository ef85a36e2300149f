"""DeepGEMM (deepseek-ai/DeepGEMM, import name ``deep_gemm``) as the ``deepgemm`` provider of ``gemm.fp8_block`` and
``gemm.fp8_block_grouped`` (128x128 block weights) and ``moe.experts_mxfp4`` (prefill-sized batches), SM100 only.

NOT RUN HERE: no machine of this project has DeepGEMM installed, and the one GPU here is an SM90 H200, where its
FP4 paths do not exist. Written against DeepGEMM's public API at commit 54e2261 (2026-06-23, version 2.6.1:
``deep_gemm/__init__.py``, ``csrc/apis/gemm.hpp``, ``csrc/apis/layout.hpp``); the marshalling is checked on the
CPU against a torch model of that documented contract (``tests/kernels/test_vendor_deepgemm.py``), not against
the library. Opt-in (``DEEPINFER_NV_DEEPGEMM=1``, ``vendors.vendor_providers``).

Numerics, and why opt-in: DeepGEMM multiplies FP8 by FP8 (or FP4). The activations are quantised here to
e4m3 per token and 128 columns with power-of-two scales (what SM100's packed UE8M0 scales need), the way
DeepSeek's inference code, vLLM and SGLang run V4. So outputs equal the op's reference applied to those
quantised activations (``quantize_rows`` then the reference: what the tests check), and differ from the op's
bf16-activation definition by that rounding (about 2^-4 relative per element).

Calls: ``fp8_gemm_nt((a, sfa), (b, sfb), d)`` with a [M, K] e4m3, sfa [M, K/128] fp32, b [N, K] e4m3,
sfb [N/128, K/128] fp32, d [M, N] bf16 written in place (the library packs fp32 power-of-two scales to UE8M0
itself on SM100); ``m_grouped_fp8_fp4_gemm_nt_contiguous((a, sfa), (b, sfb), d, m_indices, recipe_a=(1, 128),
recipe_b=(1, 32))`` with b the int8 view of the packed MXFP4 stack [E, N, K/2] (low nibble first, as the
checkpoint) and sfb its scales, transformed once per stack by ``transform_sf_into_required_layout`` and kept
(``_packed_scales``: about the scales' own bytes again).
"""
from __future__ import annotations

import torch
from torch.utils.weak import WeakTensorKeyDictionary

from deepinfer_core.kernels.ops.moe import clamped_swiglu
from deepinfer_core.kernels.ops.mxfp4_words import is_word_layout
from deepinfer_core.kernels.ops.quant import fp8_scale_to_float, quant_rows_pow2, ue8m0_to_float
from deepinfer_nvidia.kernels._common import on_cuda
from deepinfer_nvidia.kernels.vendors import arch_of, importable

GROUP = 128  # activation quantisation group (columns) and the weight block DeepGEMM's FP8 GEMM takes
# Pairs (tokens x top-k) a routed expert must average, as a fraction of DeepGEMM's row alignment, before the
# grouped FP4 GEMM is taken: every expert's rows are padded to that alignment (128), so at decode sizes most
# of the tensor-core work would be padding; below this the Triton kernels run.
MOE_MIN_FILL = 0.5
# scale stacks in DeepGEMM's layout, one per checkpoint tensor (dropped with it)
_packed = WeakTensorKeyDictionary()


def _sm100(t: torch.Tensor) -> bool:
    return importable("deep_gemm") and arch_of(t.device)[0] == 10


def quantize_rows(x: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (K a multiple of ``group``) -> (e4m3 [M, K], fp32 scales [M, K/group]) with power-of-two scales:
    ``scale = 2^ceil(log2(amax / 448))`` per row and group (``quant.quant_rows_pow2``; 1 for an all-zero group),
    ``q = e4m3(x / scale)``."""
    m, k = x.shape
    q, code = quant_rows_pow2(x, group)
    zero = q.view(m, k // group, group).float().abs().amax(dim=-1) == 0
    return q, torch.where(zero, 1.0, ue8m0_to_float(code))


def dequantize_rows(q: torch.Tensor, scale: torch.Tensor, group: int = GROUP) -> torch.Tensor:
    """Inverse of ``quantize_rows`` in fp32 [M, K] (what DeepGEMM's products see)."""
    m, k = q.shape
    return (q.float().view(m, k // group, group) * scale[..., None]).view(m, k)


# -- gemm.fp8_block ---------------------------------------------------------------------------------
def supports_fp8(x, q, scale, block) -> bool:
    """CUDA bf16 x [T, K] with an e4m3 [N, K] weight of 128x128 UE8M0 blocks (SM100's DeepGEMM asserts
    power-of-two scales; UE8M0 bytes are that by construction), K and N multiples of 128, on SM100."""
    return (on_cuda(x, q, scale) and x.dtype == torch.bfloat16 and x.dim() == 2 and q.dim() == 2
            and scale.dtype in (torch.float8_e8m0fnu, torch.uint8)
            and q.dtype == torch.float8_e4m3fn and tuple(int(b) for b in block) == (GROUP, GROUP)
            and q.shape[1] == x.shape[1] and x.shape[1] % GROUP == 0 and q.shape[0] % GROUP == 0
            and q.is_contiguous() and _sm100(x))


def gemm_fp8_block(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, block) -> torch.Tensor:
    """``gemm.fp8_block`` through DeepGEMM on FP8 activations: [T, N] bf16. Others go to the Triton kernel."""
    from deepinfer_nvidia.kernels import triton_gemm

    if not supports_fp8(x, q, scale, block):
        return triton_gemm.gemm_fp8_block(x, q, scale, block)
    import deep_gemm

    return call_fp8_gemm(deep_gemm.fp8_gemm_nt, x, q, scale)


def call_fp8_gemm(fp8_gemm_nt, x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Marshal into ``fp8_gemm_nt``'s signature: x [T, K] bf16, q [N, K] e4m3, 128x128 scales (fp32 or UE8M0)
    -> [T, N] bf16."""
    xq, xs = quantize_rows(x.contiguous())
    d = torch.empty(x.shape[0], q.shape[0], dtype=torch.bfloat16, device=x.device)
    if x.shape[0]:
        fp8_gemm_nt((xq, xs), (q, fp8_scale_to_float(scale).contiguous()), d)
    return d


def supports_fp8_grouped(x, q, scale, block, groups) -> bool:
    """``supports_fp8`` for one group (x's first Kg columns against q's first Ng rows; views, no copy), with Ng a
    multiple of 128 and x holding G groups."""
    g = int(groups)
    if not (g >= 1 and q.dim() == 2 and x.dim() == 2 and q.shape[0] % g == 0 and x.shape[1] == g * q.shape[1]):
        return False
    ng = q.shape[0] // g
    return ng % GROUP == 0 and q.is_contiguous() and supports_fp8(x[:, :q.shape[1]], q[:ng], scale, block)


def gemm_fp8_block_grouped(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, block, groups: int) -> torch.Tensor:
    """``gemm.fp8_block_grouped`` (V4's ``wo_a``) through DeepGEMM, one ``fp8_gemm_nt`` a group on FP8
    activations: [T, G*Ng] bf16. Others go to the Triton kernel."""
    from deepinfer_nvidia.kernels import triton_gemm

    if not supports_fp8_grouped(x, q, scale, block, groups):
        return triton_gemm.gemm_fp8_block_grouped(x, q, scale, block, groups)
    import deep_gemm

    return call_fp8_gemm_grouped(deep_gemm.fp8_gemm_nt, x, q, scale, int(groups))


def call_fp8_gemm_grouped(fp8_gemm_nt, x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor,
                          groups: int) -> torch.Tensor:
    """Marshal G groups into ``fp8_gemm_nt``: x quantised once (its 128-column groups never straddle two
    weight groups, Kg being a multiple of 128), then group g's columns, rows and scale rows per call."""
    t = x.shape[0]
    ng, kg = q.shape[0] // groups, q.shape[1]
    xq, xs = quantize_rows(x.contiguous())
    s = fp8_scale_to_float(scale)
    sb, kb = ng // GROUP, kg // GROUP
    out = torch.empty(t, groups * ng, dtype=torch.bfloat16, device=x.device)
    for g in range(groups if t else 0):
        d = torch.empty(t, ng, dtype=torch.bfloat16, device=x.device)  # row-major, as the library requires
        fp8_gemm_nt((xq[:, g * kg:(g + 1) * kg].contiguous(), xs[:, g * kb:(g + 1) * kb].contiguous()),
                    (q[g * ng:(g + 1) * ng], s[g * sb:(g + 1) * sb].contiguous()), d)
        out[:, g * ng:(g + 1) * ng] = d
    return out


# -- moe.experts_mxfp4 ------------------------------------------------------------------------------
def supports_experts(x, weights, ids, w1, s1, w3, s3, w2, s2, limit, alignment: int = 128) -> bool:
    """CUDA bf16 x [T, D] on SM100, D and F multiples of 128, and enough pairs per expert (``MOE_MIN_FILL``)."""
    if not (on_cuda(x, weights, ids, w1, w3, w2) and x.dtype == torch.bfloat16 and x.dim() == 2
            and ids.dim() == 2 and ids.numel() > 0 and _sm100(x)):
        return False
    if any(is_word_layout(w) for w in (w1, w3, w2)):  # core's word layout: never made on SM100
        return False
    e, f = w1.shape[0], w1.shape[1]
    return (x.shape[1] % GROUP == 0 and f % GROUP == 0
            and ids.numel() >= MOE_MIN_FILL * alignment * min(e, ids.numel()))


def moe_experts_mxfp4(x, weights, ids, w1, s1, w3, s3, w2, s2, limit):
    """``moe.experts_mxfp4`` through DeepGEMM's grouped FP8 x FP4 GEMM: [T, D] bf16. Others go to Triton."""
    from deepinfer_nvidia.kernels import triton_moe

    if not supports_experts(x, weights, ids, w1, s1, w3, s3, w2, s2, limit):
        return triton_moe.moe_experts_mxfp4(x, weights, ids, w1, s1, w3, s3, w2, s2, limit)
    import deep_gemm

    return call_grouped(deep_gemm, x, weights, ids, w1, s1, w3, s3, w2, s2, limit)


def _packed_scales(dg, s: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """``s`` [E, N, K/32] UE8M0 in DeepGEMM's required layout, made once per stack tensor and kept while it lives."""
    if s not in _packed:
        _packed[s] = dg.transform_sf_into_required_layout(ue8m0_to_float(s), mn=n, k=k, recipe=(1, 32),
                                                          num_groups=s.shape[0])
    return _packed[s]


def contiguous_layout(ids: torch.Tensor, experts: int, alignment: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of the grouped GEMM, each expert's pairs padded to ``alignment``: (``pair [M]`` int64, pair index
    ``t*k + j`` or -1 for padding, ``m_indices [M]`` int32 expert or -1). M is the static bound
    ``floor((p + min(E, p) * (alignment - 1)) / alignment) * alignment`` (p pairs over at most min(E, p) experts
    pad to no more), so no host sync is needed and a CUDA graph can hold it; blocks past the used ones are -1."""
    p = ids.numel()
    flat = ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=experts)
    padded = (counts + alignment - 1) // alignment * alignment
    start = torch.cumsum(padded, 0) - padded
    rank = torch.arange(p, device=ids.device) - (torch.cumsum(counts, 0) - counts)[flat[order]]
    dest = start[flat[order]] + rank
    m = (p + min(experts, p) * (alignment - 1)) // alignment * alignment
    pair = torch.full((m,), -1, dtype=torch.long, device=ids.device)
    pair[dest] = order
    m_indices = torch.full((m,), -1, dtype=torch.int32, device=ids.device)
    m_indices[dest] = flat[order].to(torch.int32)
    return pair, m_indices


def call_grouped(dg, x, weights, ids, w1, s1, w3, s3, w2, s2, limit) -> torch.Tensor:
    """Marshal the routed experts into ``dg``'s grouped contiguous GEMM (three calls: w1, w3, w2)."""
    t, d = x.shape
    k, e = ids.shape[1], w1.shape[0]
    pair, m_idx = contiguous_layout(ids, e, dg.get_mk_alignment_for_contiguous_layout())
    valid = pair >= 0
    tok = torch.where(valid, pair // k, torch.zeros_like(pair))
    xa = torch.where(valid[:, None], x[tok], torch.zeros_like(x[tok]))  # padding rows are zero

    def grouped(a: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        aq, as_ = quantize_rows(a)
        n, kk = w.shape[1], 2 * w.shape[2]
        out = torch.empty(a.shape[0], n, dtype=torch.bfloat16, device=a.device)
        dg.m_grouped_fp8_fp4_gemm_nt_contiguous((aq, as_), (w.view(torch.int8), _packed_scales(dg, s, n, kk)), out,
                                                m_idx, recipe_a=(1, GROUP), recipe_b=(1, 32))
        return out

    h = clamped_swiglu(grouped(xa, w1, s1), grouped(xa, w3, s3), limit)
    h = torch.where(valid[:, None], h, torch.zeros_like(h))
    y = grouped(h, w2, s2).float()
    wt = torch.where(valid, weights.reshape(-1).float()[pair.clamp(min=0)], torch.zeros_like(tok, dtype=torch.float))
    out = torch.zeros(t, d, dtype=torch.float32, device=x.device)
    out.index_add_(0, tok, torch.where(valid[:, None], y * wt[:, None], torch.zeros_like(y)))
    return out.to(x.dtype)
