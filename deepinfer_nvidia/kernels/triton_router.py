"""``moe.router_topk`` on NVIDIA: the router GEMV and the biased top-k routing in one launch (opt-in,
``DEEPINFER_NV_FUSED_ROUTER=1``; otherwise the two launches of its parts).

Why (docs/performance.md, thirty-seventh pass). At batch 1 every MoE layer's chain runs the router GEMV
(``triton_dense_gemv``: [384, 5120] fp32, ~240 programs) and then ``triton_route``'s one-program top-k, whose
fp64 softplus over 384 logits takes ~4 us on its own. Here the GEMV's programs do both:
1. each program computes its K split of a 16-expert row tile, as ``_dense_gemv_kernel`` does (same plan, same tile
   arithmetic, so the same logits bits);
2. the last split of a tile to arrive adds the partials in split order (as there), then forms the tile's scores
   ``sqrt(softplus(logit))`` and selection keys (score + bias) itself, so the fp64 work is spread over the tiles
   instead of one program, and stores them;
3. the last tile to arrive (a second arrival counter) selects each row's k experts from the stored keys
   (``triton_route._select_topk``) and normalises the stored scores of the chosen ones.
The counters are reset by the programs that used them (CUDA-graph replays start from zero).

Bits: the logits are ``gemm.dense_wide``'s from this module's parts, the scores, keys, selection and weights are
``triton_route.route_topk``'s functions of them, so the outputs equal the two-launch composition exactly
(``tests/kernels/test_triton_router_interp.py``). Like its GEMV, the launch depends on the row count (not
batch-invariant; the batch-invariant mode composes the op from its ``triton_bi`` parts).

Covered (else the parts): CUDA float x [1..4, D], a float router [E <= 4096, D] the GEMV takes (fp32, or bf16 as
the checkpoint stores it: widened in the kernel, the same logits bits at half the bytes), a float bias [E],
1 <= k <= min(32, E).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from deepinfer_core.kernels.ops.gemm import dense_wide as ref_dense_wide
from deepinfer_core.kernels.ops.moe import ROUTER_TOPK_PARTS, compose_router_topk, route_topk as ref_route
from deepinfer_nvidia.kernels import triton_dense_gemv as dg
from deepinfer_nvidia.kernels._common import FLOATS, hand_off, next_pow2, on_cuda
from deepinfer_nvidia.kernels.triton_pdl import pdl_enter, pdl_launch
from deepinfer_nvidia.kernels.triton_route import _MAX_E, _MAX_K, _is_scalar, _route_keys, _route_weights
from deepinfer_nvidia.kernels.triton_route import _select_topk, _sqrtsoftplus, route_topk

# ``DEEPINFER_NV_FUSED_ROUTER=1``: the one-launch router (opt-in until measured on a GPU); 0: the parts' two launches
FUSED_ROUTER = os.environ.get("DEEPINFER_NV_FUSED_ROUTER", "0") == "1"
_REFERENCE = compose_router_topk(dict(zip(ROUTER_TOPK_PARTS, (ref_dense_wide, ref_route))))


@triton.jit
def _tile_scores_then_route(logits, b_ptr, rn, nmask, out, omask, s_ptr, key_ptr, cnt_ptr, wt_ptr, ids_ptr, M, N,
                            TILES, scaling, TOPK: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_TK: tl.constexpr):
    """Store a finished tile's scores and keys; the last tile of the launch to arrive routes every row."""
    s = _sqrtsoftplus(logits)
    key = _route_keys(s, tl.load(b_ptr + rn, mask=nmask, other=0.0).to(tl.float32)[None, :])
    tl.store(s_ptr + out, s, mask=omask)
    tl.store(key_ptr + out, key, mask=omask)
    tl.debug_barrier()  # every thread's scores are stored before the tile is counted
    if tl.atomic_add(cnt_ptr + TILES, 1, sem="acq_rel") == TILES - 1:
        tl.atomic_xchg(cnt_ptr + TILES, 0)
        e = tl.arange(0, BLOCK_E)
        valid = e < N
        j = tl.arange(0, BLOCK_TK)
        jm = j < TOPK
        for m in range(M):
            keys = tl.load(key_ptr + m * N + e, mask=valid, other=0.0, cache_modifier=".cg")
            sel = _select_topk(keys, e, valid, TOPK, BLOCK_E, BLOCK_TK)
            chosen = tl.load(s_ptr + m * N + sel, mask=jm, other=0.0, cache_modifier=".cg")
            tl.store(wt_ptr + m * TOPK + j, _route_weights(chosen, jm, scaling), mask=jm)
            tl.store(ids_ptr + m * TOPK + j, sel, mask=jm)


@triton.jit
def _router_topk_kernel(x_ptr, w_ptr, b_ptr, s_ptr, key_ptr, part_ptr, cnt_ptr, wt_ptr, ids_ptr, M, N, K, stride_x,
                        stride_w, k_per_split, scaling, TILES, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, TOPK: tl.constexpr, BLOCK_E: tl.constexpr,
                        BLOCK_TK: tl.constexpr, PDL: tl.constexpr = 0):
    """Program (row tile of BLOCK_N experts, K split): the router logits of x [M, K] against w [N, K] (fp32, or half
    precision widened) for this tile and split; cnt: zeroed int32 [TILES + 1] (per-tile split arrivals, then tile
    arrivals), reset here."""
    pdl_enter(PDL)
    pid_n = tl.program_id(0)
    acc, rn, nmask, out, omask = dg._split_products(x_ptr, w_ptr, M, N, K, stride_x, stride_w, k_per_split, BLOCK_M,
                                                    BLOCK_N, BLOCK_K, 1)
    if SPLIT == 1:
        _tile_scores_then_route(acc, b_ptr, rn, nmask, out, omask, s_ptr, key_ptr, cnt_ptr, wt_ptr, ids_ptr, M, N,
                                TILES, scaling, TOPK, BLOCK_E, BLOCK_TK)
    else:
        tl.store(part_ptr + tl.program_id(1) * M * N + out, acc, mask=omask)
        tl.debug_barrier()  # every thread's partial is stored before the arrival is counted
        if tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel") == SPLIT - 1:
            tl.atomic_xchg(cnt_ptr + pid_n, 0)
            total = dg._split_total(part_ptr, out, omask, M, N, SPLIT, BLOCK_M, BLOCK_N)
            _tile_scores_then_route(total, b_ptr, rn, nmask, out, omask, s_ptr, key_ptr, cnt_ptr, wt_ptr, ids_ptr, M,
                                    N, TILES, scaling, TOPK, BLOCK_E, BLOCK_TK)


def fused_takes(x, gate_w, bias, top_k, scaling) -> bool:
    """Operands the one-launch router serves: the GEMV's (``triton_dense_gemv.takes``: a float router, fp32 or as the
    checkpoint stores it) and the routing's (``triton_route``)."""
    e = gate_w.shape[0] if gate_w.dim() == 2 else 0
    return (dg.takes(x, gate_w) and 0 < e <= _MAX_E and bias.dim() == 1
            and bias.shape[0] == e and bias.dtype in FLOATS and isinstance(top_k, int) and 1 <= top_k <= min(_MAX_K, e)
            and _is_scalar(scaling))


def fused_router_topk(x: torch.Tensor, gate_w: torch.Tensor, bias: torch.Tensor, top_k: int, scaling: float,
                      sms: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The one launch for ``fused_takes`` operands (CUDA, or CPU tensors under Triton's interpreter: tests), planned
    as ``triton_dense_gemv.gemv`` plans the router's GEMV on ``sms`` SMs."""
    from deepinfer_nvidia.kernels.triton_fp8_gemv import _counters

    m, (n, k) = x.shape[0], gate_w.shape
    x = x if x.stride(1) == 1 else x.contiguous()
    bm, bk, split = dg.plan(m, n, k, sms)
    k_per = triton.cdiv(triton.cdiv(k, bk), split) * bk
    tiles = triton.cdiv(n, dg.BLOCK_N)
    s, key = (torch.empty(m, n, dtype=torch.float32, device=x.device) for _ in range(2))
    part = torch.empty(split, m, n, dtype=torch.float32, device=x.device) if split > 1 else s
    weights = torch.empty(m, top_k, dtype=torch.float32, device=x.device)
    ids = torch.empty(m, top_k, dtype=torch.long, device=x.device)
    _router_topk_kernel[(tiles, split)](x, gate_w, bias.contiguous(), s, key, part, _counters(x.device, tiles + 1),
                                        weights, ids, m, n, k, x.stride(0), gate_w.stride(0), k_per, float(scaling),
                                        tiles, SPLIT=split, BLOCK_M=bm, BLOCK_N=dg.BLOCK_N, BLOCK_K=bk, TOPK=top_k,
                                        BLOCK_E=next_pow2(n), BLOCK_TK=next_pow2(top_k), num_warps=4,
                                        **pdl_launch())
    return weights, ids


def supports_router(x, gate_w, bias, top_k, scaling) -> bool:
    """CUDA operands (the parts cover the rest of what the reference does, or hand it over)."""
    return on_cuda(x, gate_w, bias)


def router_topk(x: torch.Tensor, gate_w: torch.Tensor, bias: torch.Tensor, top_k: int, scaling: float
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """``moe.router_topk``: x [T, D], gate_w [E, D] (fp32 or the checkpoint's bf16 / fp16, widened in the kernel),
    bias [E] -> (weights [T, k] fp32, ids [T, k] int64). One launch where ``FUSED_ROUTER`` is on and ``fused_takes``
    (which holds only for operands ``gemm.dense_wide`` accepts); else the GEMV (fp32 logits, its operand errors) and
    ``route_topk``."""
    if not supports_router(x, gate_w, bias, top_k, scaling):
        return hand_off("moe.router_topk", f"operands on {x.device} not covered", _REFERENCE, x, gate_w, bias, top_k,
                        scaling)
    if FUSED_ROUTER and fused_takes(x, gate_w, bias, top_k, scaling):
        from deepinfer_nvidia.kernels.triton_gemm import _sm_count

        return fused_router_topk(x, gate_w, bias, top_k, scaling, _sm_count(x.device))
    return route_topk(dg.gemm_dense_wide(x, gate_w), bias, top_k, scaling)
