"""Triton lightning-indexer scores (``index.scores``).

A program owns one query token and ``CHUNKS * BLOCK_N`` candidates: the token's
``[Hi, Di]`` query block is loaded once, each chunk of candidate key rows is
gathered by index (``-1`` candidates are masked, never loaded), ``Q K^T`` runs on
the tensor cores with fp32 accumulation, then ``relu``, the per-head weights and
the head sum are applied in registers and one fp32 score per candidate is
written (``-inf`` where the candidate is ``-1``).

From ``TILED_MIN_T`` query tokens (prefill) ``scores`` runs ``triton_indexer_tiled`` instead, where tokens of
one sequence share each gathered key tile. ``scores_bi`` (batch-invariant mode) always runs the per-token kernel.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from deepinfer_core.kernels.ops.indexer import indexer_scores
from deepinfer_nvidia.kernels import triton_indexer_tiled as _tiled
from deepinfer_nvidia.kernels._common import FLOATS, dot_precision, hand_off, next_pow2, on_cuda
from deepinfer_nvidia.kernels.triton_pdl import pdl_enter, pdl_launch

# Query tokens from which the token-tiled kernel runs (a decode batch's tokens see different sequences).
TILED_MIN_T = 256
# Where the default launch (64 candidates a chunk, 4 chunks a program) fills less than one wave of SMs, e.g.
# batch 1 over 1024 candidates (V4.1 at a 4k context: 4 programs, 8.1 us a call in the twenty-fourth pass's
# profile), ``scores`` takes 32-candidate programs of one chunk, doubling the chunks only while the launch would
# exceed two waves. Each candidate's score is computed the same way (the head sum over the same [heads, chunk]
# tile shape per program); ``DEEPINFER_NV_INDEXER_SMALL_SPLIT=0``: the default launch at every size.
# ``scores_per_token`` (batch-invariant) never takes it: its launch must not depend on the batch.
SMALL_BATCH_SPLIT = os.environ.get("DEEPINFER_NV_INDEXER_SMALL_SPLIT", "1") == "1"
SMALL_BLOCK_N = 32


@triton.jit
def _scores_kernel(q_ptr, w_ptr, k_ptr, cand_ptr, out_ptr, H, D, N, score_scale,
                   CHUNKS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                   PREC: tl.constexpr, PDL: tl.constexpr = 0):
    pdl_enter(PDL)
    t = tl.program_id(0)
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    hmask = h < H
    dmask = d < D
    q = tl.load(q_ptr + (t.to(tl.int64) * H + h[:, None]) * D + d[None, :], mask=hmask[:, None] & dmask[None, :],
                other=0.0)
    w = tl.load(w_ptr + t.to(tl.int64) * H + h, mask=hmask, other=0.0)
    for c in range(CHUNKS):
        n = (tl.program_id(1) * CHUNKS + c) * BLOCK_N + tl.arange(0, BLOCK_N)
        nmask = n < N
        idx = tl.load(cand_ptr + t.to(tl.int64) * N + n, mask=nmask, other=-1)
        valid = idx >= 0
        k = tl.load(k_ptr + idx[:, None] * D + d[None, :], mask=valid[:, None] & dmask[None, :], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PREC)  # [BLOCK_H, BLOCK_N]
        s = tl.maximum(s, 0.0) * score_scale
        score = tl.sum(s * w[:, None], axis=0)
        score = tl.where(valid, score, float("-inf"))
        tl.store(out_ptr + t.to(tl.int64) * N + n, score, mask=nmask)


def supports(q, weights, keys, cand, score_scale) -> bool:
    """CUDA q [T, Hi, Di] (fp32/bf16/fp16, Hi <= 128, Di <= 256), keys of q's dtype, float weights, int64 cand."""
    return (on_cuda(q, weights, keys, cand) and q.dtype in FLOATS and q.dim() == 3 and keys.dtype == q.dtype
            and keys.dim() == 2 and q.shape[1] <= 128 and q.shape[2] <= 256 and cand.dtype == torch.int64
            and cand.dim() == 2 and weights.dim() == 2)


def _checked(q, weights, keys, cand, score_scale, tiled: bool, launch: tuple | None = None) -> torch.Tensor:
    if not supports(q, weights, keys, cand, score_scale):
        return hand_off("index.scores", f"operands q {q.dtype} {tuple(q.shape)} on {q.device} not covered",
                        indexer_scores, q, weights, keys, cand, score_scale)
    t, h, d = q.shape
    if keys.shape[1] != d or weights.shape != (t, h) or cand.shape[0] != t:
        raise ValueError(f"index.scores: q [{t}, {h}, {d}] needs keys [S, {d}], weights [{t}, {h}], cand [{t}, N]; "
                         f"got {tuple(keys.shape)}, {tuple(weights.shape)}, {tuple(cand.shape)}")
    n = cand.shape[1]
    out = torch.empty(t, n, dtype=torch.float32, device=q.device)
    if t == 0 or n == 0:
        return out
    # bf16 / fp16 weights are read as they are and widened in the kernel (the model passes weights_proj's output
    # with its scale folded into score_scale: no cast or scale launch of its own)
    w = weights if weights.dtype in FLOATS else weights.float()
    q, w, keys, cand = q.contiguous(), w.contiguous(), keys.contiguous(), cand.contiguous()
    if tiled and t >= TILED_MIN_T:
        _tiled.launch(q, w, keys, cand, out, score_scale, dot_precision(q.dtype))
        return out
    bh = max(16, next_pow2(h))
    bd = max(16, next_pow2(d))
    bn = 64 if bh * bd <= 64 * 128 else 32
    chunks = 4 if n >= 4 * bn else 1
    if launch is not None:  # (candidates a chunk, chunks a program): benchmarks and tests
        bn, chunks = launch
    elif tiled and SMALL_BATCH_SPLIT:
        from deepinfer_nvidia.kernels.triton_gemm import _sm_count

        sms = _sm_count(q.device)
        if t * triton.cdiv(n, bn * chunks) < sms:
            bn, chunks = min(bn, SMALL_BLOCK_N), 1
            while chunks < 4 and t * triton.cdiv(n, bn * chunks) > 2 * sms:
                chunks *= 2
    grid = (t, triton.cdiv(n, bn * chunks))
    _scores_kernel[grid](q, w, keys, cand, out, h, d, n, float(score_scale), CHUNKS=chunks, BLOCK_H=bh, BLOCK_N=bn,
                         BLOCK_D=bd, PREC=dot_precision(q.dtype), num_warps=4, **pdl_launch())
    return out


def scores(q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor, cand: torch.Tensor,
           score_scale: float, launch: tuple | None = None) -> torch.Tensor:
    """``index.scores``: fp32 [T, N] = sum_h w[t,h] relu(q[t,h] . keys[cand[t,n]]) * scale, -inf at cand < 0.
    Token-tiled from ``TILED_MIN_T`` tokens; ``launch`` (candidates a chunk, chunks a program) overrides the
    per-token launch's shape below that (benchmarks, tests)."""
    return _checked(q, weights, keys, cand, score_scale, tiled=True, launch=launch)


def scores_per_token(q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor, cand: torch.Tensor,
                     score_scale: float) -> torch.Tensor:
    """``index.scores`` with one program per query token at any size: a token's bits do not depend on the
    batch (registered as ``triton_bi``)."""
    return _checked(q, weights, keys, cand, score_scale, tiled=False)
