"""Routed experts on the checkpoint layout (MXFP4 or FP8 blocks) with in-kernel dequantisation.

``moe.experts_mxfp4`` / ``moe.experts_fp8``: tokens are grouped by expert once (one host sync for
the per-expert counts), then each routed expert runs three GEMMs through the Triton kernels of
``triton_gemm`` that dequantise the weight tiles in registers. No bf16 copy of an expert is ever
materialised, so only the routed experts' native bytes are read. (A single grouped kernel over all
experts is the next step; this version pays one launch per expert and matrix.)
"""
from __future__ import annotations

import torch

from deepinfer_core.kernels.ops.moe import clamped_swiglu, experts_fp8, experts_mxfp4
from deepinfer_nvidia.kernels._common import hand_off, on_cuda
from deepinfer_nvidia.kernels.triton_gemm import gemm_fp8_block, gemm_mxfp4


def supports(x, weights, ids, *rest) -> bool:
    return on_cuda(x, weights, ids) and x.dtype in (torch.bfloat16, torch.float16, torch.float32) and x.dim() == 2


def _run(x, weights, ids, limit, gemm3):
    t, d = x.shape
    k = ids.shape[1]
    out = torch.zeros(t, d, dtype=torch.float32, device=x.device)
    if t == 0 or k == 0:
        return out.to(x.dtype)
    flat = ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    experts, counts = torch.unique_consecutive(flat[order], return_counts=True)
    tok_all = order // k
    w_all = weights.reshape(-1).float()[order]
    start = 0
    for e, n in zip(experts.tolist(), counts.tolist()):  # one host sync above, none in the loop
        tok = tok_all[start:start + n]
        xe = x.index_select(0, tok)
        g1, g3, g2 = gemm3(e)
        h = clamped_swiglu(g1(xe), g3(xe), limit)
        y = g2(h).float() * w_all[start:start + n, None]
        out.index_add_(0, tok, y)
        start += n
    return out.to(x.dtype)


def moe_experts_mxfp4(x, weights, ids, w1, s1, w3, s3, w2, s2, limit):
    """x [T, D]; w1, w3 [E, F, D/2] uint8 + UE8M0 [E, F, D/32]; w2 [E, D, F/2] + [E, D, F/32]."""
    if not supports(x, weights, ids):
        return hand_off("moe.experts_mxfp4", f"operands x {x.dtype} on {x.device} not covered",
                        experts_mxfp4, x, weights, ids, w1, s1, w3, s3, w2, s2, limit)

    def gemm3(e):
        return (lambda a: gemm_mxfp4(a, w1[e], s1[e]), lambda a: gemm_mxfp4(a, w3[e], s3[e]),
                lambda a: gemm_mxfp4(a, w2[e], s2[e]))

    return _run(x, weights, ids, limit, gemm3)


def moe_experts_fp8(x, weights, ids, w1, s1, w3, s3, w2, s2, block, limit):
    """x [T, D]; w1, w3 [E, F, D] e4m3 + block scales [E, F/bn, D/bk]; w2 [E, D, F] + [E, D/bn, F/bk]."""
    if not supports(x, weights, ids):
        return hand_off("moe.experts_fp8", f"operands x {x.dtype} on {x.device} not covered",
                        experts_fp8, x, weights, ids, w1, s1, w3, s3, w2, s2, block, limit)

    def gemm3(e):
        return (lambda a: gemm_fp8_block(a, w1[e], s1[e], block), lambda a: gemm_fp8_block(a, w3[e], s3[e], block),
                lambda a: gemm_fp8_block(a, w2[e], s2[e], block))

    return _run(x, weights, ids, limit, gemm3)
