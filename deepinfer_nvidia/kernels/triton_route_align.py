"""``moe.topk_experts_mxfp4`` at one token: the router's top-k and the swap kernels' routing layout in one launch.

At decode batch 1 a biased top-k MoE layer ran, on the chain: the router GEMV, ``moe.route_topk`` (one program),
then ``triton_align``'s launch (the (expert, block) layout and x in the swap kernels' K order), then the two swap
launches. The align launch was ~2.4 us and a launch handoff a layer, ~20 us a step of the 8-layer slice on an H100
(docs/performance.md, forty-fifth and fiftieth passes). Here the route program lays out the routing itself:

- program 0 selects and weighs the k experts exactly as ``triton_route._topk_kernel`` does (the same functions,
  block sizes and warps, so the same bits), then writes the layout ``triton_moe.align`` gives one token: the k
  experts ascending, the r-th owning block r with its one pair (the routing slot) at row ``r * block_m``, every
  other row the sentinel k, every other block the sentinel E;
- programs 1.. copy x into the swap kernels' K order, as ``triton_align``'s programs 1.. do.

The swap launches then read that layout (``gluon_moe_swap.swap_mxfp4``'s ``aligner``), so the result equals
``moe.experts_mxfp4(x, *moe.router_topk(...))`` on this platform bit for bit. Other operands (more than one token,
shapes or devices the swap kernels do not take, ``DEEPINFER_NV_ROUTE_ALIGN=0``) run the two ops' nvidia kernels in
turn. Not flagged batch-invariant: that mode composes the op from its flagged parts.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from deepinfer_nvidia.kernels.triton_align import XB, _permute_chunk
from deepinfer_nvidia.kernels.triton_pdl import pdl_enter, pdl_launch
from deepinfer_nvidia.kernels.triton_route import _route_row, _warps, supports_route
from deepinfer_nvidia.kernels._common import next_pow2

# The one-launch route and layout at one token (``=0``: the route, then the align launch, as before this op).
ROUTE_ALIGN = os.environ.get("DEEPINFER_NV_ROUTE_ALIGN", "1") == "1"
_RB = 64  # rows (and blocks) a sentinel store covers


@triton.jit
def _route_align_kernel(lg_ptr, b_ptr, w_ptr, ids_ptr, pair_ptr, bexp_ptr, x_ptr, xp_ptr, E, XN, KD, NROWS, NB,
                        scaling, K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
                        BLOCK_M: tl.constexpr, PERM: tl.constexpr, XB: tl.constexpr, RB: tl.constexpr,
                        PDL: tl.constexpr = 0):
    """Program 0: one token's logits [E] -> weights [K] fp32, ids [K] int64, pair [NROWS] and block_expert [NB] int32
    (``triton_moe.align``'s layout). Programs 1..: XB elements each of x [XN / KD, KD] into ``xp`` in K order."""
    pdl_enter(PDL)
    pid = tl.program_id(0)
    if pid > 0:
        _permute_chunk(x_ptr, xp_ptr, pid - 1, XN, KD, PERM, XB)
    else:
        sel = _route_row(lg_ptr, b_ptr, w_ptr, ids_ptr, E, scaling, K, BLOCK_E, BLOCK_K)  # route_topk's bits
        j = tl.arange(0, BLOCK_K)
        jm = j < K
        # the layout: the k (distinct) experts ascending; the r-th owns block r, its pair (slot) at row r * BLOCK_M
        srt = tl.sort(tl.where(jm, sel.to(tl.int32) * BLOCK_K + j, E * BLOCK_K + j))
        tl.store(bexp_ptr + j, srt // BLOCK_K, mask=jm)
        tl.store(pair_ptr + j * BLOCK_M, srt % BLOCK_K, mask=jm)
        r = tl.arange(0, RB)
        for start in range(0, NROWS, RB):  # the other rows: the sentinel (no store touches a row twice)
            row = start + r
            head = (row % BLOCK_M == 0) & (row // BLOCK_M < K)
            tl.store(pair_ptr + row, K, mask=(row < NROWS) & (head == 0))
        for start in range(K, NB, RB):  # the unused blocks
            tl.store(bexp_ptr + start + r, E, mask=start + r < NB)


def launch_route_align(logits: torch.Tensor, bias: torch.Tensor, top_k: int, scaling: float, x: torch.Tensor,
                       block_m: int, nb: int, perm: int, weights: torch.Tensor, ids: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One launch: logits [1, E] (unit stride), bias [E] -> ``weights`` [1, k] fp32 and ``ids`` [1, k] int64 written
    in place; returns (pair [nb * block_m] int32, block_expert [nb] int32, x [1, D] in K order (perm 1 or 2, as
    ``triton_align.align_small``)). ``nb`` >= k: blocks k.. are marked unused (``triton_moe.num_blocks`` gives k + 1)."""
    e, d = logits.shape[1], x.shape[1]
    if nb < top_k or perm not in (1, 2) or d % (128 if perm == 2 else 8):
        raise ValueError(f"route_align: needs nb >= k ({nb}, {top_k}), perm 1 or 2 ({perm}) and D = {d} a multiple "
                         f"of {128 if perm == 2 else 8}")
    pair = torch.empty(nb * block_m, dtype=torch.int32, device=x.device)
    bexp = torch.empty(nb, dtype=torch.int32, device=x.device)
    xp = torch.empty_like(x)
    block = next_pow2(e)
    _route_align_kernel[(1 + triton.cdiv(d, XB),)](
        logits, bias.contiguous(), weights, ids, pair, bexp, x, xp, e, d, d, nb * block_m, nb, float(scaling),
        K=top_k, BLOCK_E=block, BLOCK_K=next_pow2(top_k), BLOCK_M=block_m, PERM=perm, XB=XB, RB=_RB,
        num_warps=_warps(block), **pdl_launch())
    return pair, bexp, xp


def one_launch_uncovered(x, logits, bias, top_k, scaling, w1) -> str | None:
    """Why this module's launch does not serve these operands (None: it does)."""
    from deepinfer_nvidia.kernels.triton_moe import swap_takes

    if not ROUTE_ALIGN:
        return "DEEPINFER_NV_ROUTE_ALIGN=0"
    if not (x.dim() == 2 and x.shape[0] == 1 and x.is_contiguous()):
        return "not one contiguous token"
    if not supports_route(logits, bias, top_k, scaling):
        return "routing not covered"
    if not swap_takes(x, top_k, w1):
        return "the swap kernels do not take these experts"
    return None


def supports(x, gate_w, bias, top_k, scaling, w1, *rest) -> bool:
    """CUDA operands (the parts check the rest and run their own fallbacks)."""
    return all(isinstance(t, torch.Tensor) and t.is_cuda for t in (x, gate_w, bias, w1))


def topk_experts_mxfp4(x, gate_w, bias, top_k, scaling, w1, s1, w3, s3, w2, s2, limit) -> torch.Tensor:
    """``moe.topk_experts_mxfp4``: x [T, D] bf16, gate_w [E, D], bias [E] fp32, the six MXFP4 stacks (checkpoint
    bytes or core's word layout) -> [T, D]. One token the swap kernels take: the router GEMV, this module's
    launch, the two swap launches and the slot sum. Otherwise ``gemm_dense_wide``, ``route_topk`` and
    ``moe_experts_mxfp4`` in turn (each with its own fallbacks)."""
    from deepinfer_nvidia.kernels import gluon_moe_swap as sw
    from deepinfer_nvidia.kernels.triton_dense_gemv import gemm_dense_wide
    from deepinfer_nvidia.kernels.triton_moe import _check_stacks, _word_layout, moe_experts_mxfp4
    from deepinfer_nvidia.kernels.triton_route import route_topk

    logits = gemm_dense_wide(x, gate_w)
    if one_launch_uncovered(x, logits, bias, top_k, scaling, w1) is None:
        packed = _word_layout(w1, w3, w2)
        b1, b3, b2 = (w.view(torch.uint8) for w in (w1, w3, w2))
        _check_stacks(x, b1, s1, b3, s3, b2, s2)
        weights = torch.empty(1, top_k, dtype=torch.float32, device=x.device)
        ids = torch.empty(1, top_k, dtype=torch.long, device=x.device)
        lg = logits if logits.stride(1) == 1 else logits.contiguous()

        def aligner(block_m: int, nb: int, perm: int):
            return launch_route_align(lg, bias, top_k, scaling, x, block_m, nb, perm, weights, ids)

        out = sw.swap_or_none(x, weights, ids, b1, s1, b3, s3, b2, s2, limit, packed=packed, aligner=aligner)
        if out is not None:
            return out
    weights, ids = route_topk(logits, bias, top_k, scaling)
    return moe_experts_mxfp4(x, weights, ids, w1, s1, w3, s3, w2, s2, limit)
