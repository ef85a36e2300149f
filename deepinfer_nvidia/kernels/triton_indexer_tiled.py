"""Lightning-indexer scores for prefill-sized calls: ``BT`` query tokens share each gathered key tile.

``triton_indexer._scores_kernel`` gives every query token its own program, so each token gathers its own copy of
every candidate key row, and its ``Q K^T`` has only ``Hi`` (64) rows. In a prefill the tokens of one sequence
see the same key slots (a prefix of one list: ``cand[t]`` is the sequence's compressed slots in position order,
``-1`` past what token t may see). Here a program owns ``BT`` consecutive tokens and a range of candidates:

- per chunk of ``BLOCK_N`` candidates it loads the ``[BT, BLOCK_N]`` slot ids; when every token's id is either
  the chunk's common id or ``-1`` (the usual case) the keys are gathered once and one ``[BT*Hi, D] x [D, BLOCK_N]``
  product serves all ``BT`` tokens (``relu``, the head weights and the head sum in registers);
- chunks no token may see are written as ``-inf`` without a product (causal prefill: half of them);
- a program whose tokens disagree (a tile that spans two sequences, or arbitrary candidates) runs token by token.

Measured at 8k tokens (``docs/perf/pass14b``, ``pass14c``): 1.15 ms per call against 1.61 for the per-token
kernel; 2, not 4 or 8, tokens per program (``Hi * BT`` = 128 rows).

Scores are written as fp32, ``-inf`` where the id is ``-1``: the same values as the per-token kernel up to the
products' accumulation order. Not batch-invariant (a token's tile depends on its neighbours); batch-invariant
mode keeps the per-token kernel (``triton_indexer.scores_per_token``).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _head_sum(q, w, k, score_scale, BT: tl.constexpr, BH: tl.constexpr, BN: tl.constexpr, PREC: tl.constexpr):
    """q [BT*BH, D], w [BT*BH], k [BN, D] -> [BT, BN]: sum over each token's heads of w * relu(q.k) * scale."""
    s = tl.dot(q, tl.trans(k), input_precision=PREC)
    s = tl.maximum(s, 0.0) * score_scale * w[:, None]
    return tl.sum(tl.reshape(s, [BT, BH, BN]), axis=1)


@triton.jit
def _scores_tiled_kernel(q_ptr, w_ptr, k_ptr, cand_ptr, out_ptr, T, H, D, N, score_scale,
                         BT: tl.constexpr, CHUNKS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_D: tl.constexpr, PREC: tl.constexpr):
    """The same scores with the checks hoisted: a first pass over the program's slot ids finds whether all of
    its chunks agree and the last chunk any token sees, so the main loop has no branch (pipelined loads)."""
    t0 = tl.program_id(0) * BT
    tt = t0 + tl.arange(0, BT)
    tmask = tt < T
    c0 = tl.program_id(1) * CHUNKS
    agree = 1
    last = c0 - 1
    for c in range(c0, c0 + CHUNKS):
        n = c * BLOCK_N + tl.arange(0, BLOCK_N)
        idx = tl.load(cand_ptr + tt.to(tl.int64)[:, None] * N + n[None, :], mask=tmask[:, None] & (n < N)[None, :],
                      other=-1)
        common = tl.max(idx, axis=0)
        agree = tl.minimum(agree, tl.min(tl.where((idx == common[None, :]) | (idx < 0), 1, 0)))
        last = tl.where(tl.max(common) >= 0, c, last)
    rows = tl.arange(0, BT * BLOCK_H)
    rt = t0 + rows // BLOCK_H
    rh = rows % BLOCK_H
    rmask = (rt < T) & (rh < H)
    d = tl.arange(0, BLOCK_D)
    dmask = d < D
    q = tl.load(q_ptr + (rt.to(tl.int64) * H + rh)[:, None] * D + d[None, :], mask=rmask[:, None] & dmask[None, :],
                other=0.0)
    w = tl.load(w_ptr + rt.to(tl.int64) * H + rh, mask=rmask, other=0.0)
    if agree == 1:
        for c in range(c0, last + 1):
            n = c * BLOCK_N + tl.arange(0, BLOCK_N)
            m2 = tmask[:, None] & (n < N)[None, :]
            idx = tl.load(cand_ptr + tt.to(tl.int64)[:, None] * N + n[None, :], mask=m2, other=-1)
            common = tl.max(idx, axis=0)
            k = tl.load(k_ptr + common[:, None] * D + d[None, :], mask=(common >= 0)[:, None] & dmask[None, :],
                        other=0.0)
            score = _head_sum(q, w, k, score_scale, BT, BLOCK_H, BLOCK_N, PREC)
            tl.store(out_ptr + tt.to(tl.int64)[:, None] * N + n[None, :], tl.where(idx >= 0, score, float("-inf")),
                     mask=m2)
        for c in range(last + 1, c0 + CHUNKS):  # chunks no token of the tile sees
            n = c * BLOCK_N + tl.arange(0, BLOCK_N)
            tl.store(out_ptr + tt.to(tl.int64)[:, None] * N + n[None, :],
                     tl.full([BT, BLOCK_N], float("-inf"), tl.float32), mask=tmask[:, None] & (n < N)[None, :])
    else:  # tokens of different sequences: one gather per token and chunk, keep that token's row
        for c in range(c0, c0 + CHUNKS):
            n = c * BLOCK_N + tl.arange(0, BLOCK_N)
            nmask = n < N
            m2 = tmask[:, None] & nmask[None, :]
            idx = tl.load(cand_ptr + tt.to(tl.int64)[:, None] * N + n[None, :], mask=m2, other=-1)
            score = tl.full([BT, BLOCK_N], float("-inf"), tl.float32)
            for j in tl.static_range(BT):
                tj = tl.full([BLOCK_N], 0, tl.int32) + t0 + j
                ij = tl.load(cand_ptr + tj.to(tl.int64) * N + n, mask=nmask & (tj < T), other=-1)
                k = tl.load(k_ptr + ij[:, None] * D + d[None, :], mask=(ij >= 0)[:, None] & dmask[None, :],
                            other=0.0)
                sj = _head_sum(q, w, k, score_scale, BT, BLOCK_H, BLOCK_N, PREC)
                score = tl.where(tl.arange(0, BT)[:, None] == j, sj, score)
            tl.store(out_ptr + tt.to(tl.int64)[:, None] * N + n[None, :], tl.where(idx >= 0, score, float("-inf")),
                     mask=m2)


def launch(q, w, keys, cand, out, score_scale: float, prec: str, bt: int = 2, block_n: int = 64,
           chunks: int = 16, warps: int = 4) -> None:
    """q [T, H, D] contiguous, w [T, H] fp32, keys [S, D], cand [T, N] int64, out [T, N] fp32 (written)."""
    t, h, d = q.shape
    n = cand.shape[1]
    bh = max(16, 1 << (h - 1).bit_length())
    bd = max(16, 1 << (d - 1).bit_length())
    chunks = max(1, min(chunks, triton.cdiv(n, block_n)))
    grid = (triton.cdiv(t, bt), triton.cdiv(n, block_n * chunks))
    _scores_tiled_kernel[grid](q, w, keys, cand, out, t, h, d, n, float(score_scale), BT=bt, CHUNKS=chunks,
                               BLOCK_H=bh, BLOCK_N=block_n, BLOCK_D=bd, PREC=prec, num_warps=warps)
