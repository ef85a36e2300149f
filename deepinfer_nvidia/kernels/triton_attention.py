"""Triton sparse shared-KV MQA with per-head sinks (``attention.sparse_sink``).

Every query token attends to an explicit list of cache rows in up to two flat
caches (the layer's sliding window, then the selected compressed entries). One
KV vector per row serves as key and value (MQA: one KV head for all H heads).

Work split: a program owns one token and ``BLOCK_H`` heads, and, for long slot
lists at small batch, one of ``SPLITS`` slices of the slot list (flash-decoding:
each split keeps its own running max / sum / accumulator, a second small kernel
merges them). Per chunk of ``BLOCK_N`` slots it gathers the K rows by index
(``-1`` rows are masked, never loaded), computes ``S = Q K^T`` on the tensor
cores with fp32 accumulation, and updates an online softmax whose running max
starts at the head's sink logit with running sum 1: the sink enters only the
denominator, and a row with no valid slot ends as ``0 / 1 = 0`` like the
reference. ``O += P K`` reuses the gathered tile, so K is read once per chunk.

``sparse_sink_bi`` (provider ``triton_bi``) is the batch-invariant launch: the default picks
``BLOCK_H`` from T and the number of splits from T and the padded slot count (the longest row
of the step), and a different split changes how a row's softmax is merged. The variant runs
``BI_BLOCK_H`` heads per program and no split. That is invariant because of how the step
metadata lays out the slot lists (``deepinfer_core/runner/context.py``): the sliding-window
list of a token has the fixed width W with its -1 entries where its positions are < 0, and the
compressed list holds the row's valid entries first and the batch's padding (-1) after them.
So every valid slot sits in the same ``BLOCK_N`` chunk at the same lane whatever the batch, and
a chunk of padding is an exact no-op (its max is -inf, so ``alpha = 1`` and ``p = 0``).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from deepinfer_core.kernels.ops.attention import sparse_attention_sink
from deepinfer_core.kernels.ops.rope import apply_rope
from deepinfer_nvidia.kernels._common import FLOATS, dot_precision, hand_off, next_pow2, on_cuda
from deepinfer_nvidia.kernels.triton_pdl import pdl_enter, pdl_launch
from deepinfer_nvidia.kernels import triton_rope
from deepinfer_nvidia.kernels.triton_rope import pair_angles, rotate_tail

_LOG2E = 1.4426950408889634


@triton.jit
def _attend(q, kv_ptr, idx_ptr, t, n_slots, n_lo, n_hi, D, qk_scale, m_i, l_i, acc,
            BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PREC: tl.constexpr):
    """Fold slots [n_lo, n_hi) of one cache into the running (m_i, l_i, acc) (log2 domain)."""
    d = tl.arange(0, BLOCK_D)
    dmask = d < D
    for start in range(n_lo, n_hi, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        idx = tl.load(idx_ptr + t.to(tl.int64) * n_slots + n, mask=n < n_hi, other=-1)
        valid = idx >= 0
        k = tl.load(kv_ptr + idx[:, None] * D + d[None, :], mask=valid[:, None] & dmask[None, :], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(k.dtype), k, input_precision=PREC)
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def _attn_kernel(q_ptr, kva_ptr, idxa_ptr, kvb_ptr, idxb_ptr, sink_ptr, o_ptr, ml_ptr,
                 H, D, Na, Nb, qk_scale, per_split, pos_ptr, f_ptr,
                 HAS_B: tl.constexpr, SPLITS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_D: tl.constexpr, PREC: tl.constexpr, ROPE_Q: tl.constexpr = False, HALF: tl.constexpr = 1,
                 PDL: tl.constexpr = 0):
    pdl_enter(PDL)
    t = tl.program_id(0)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    sp = tl.program_id(2)
    hmask = h < H
    d = tl.arange(0, BLOCK_D)
    dmask = d < D
    qoff = (t.to(tl.int64) * H + h[:, None]) * D + d[None, :]
    q = tl.load(q_ptr + qoff, mask=hmask[:, None] & dmask[None, :], other=0.0)
    if ROPE_Q:  # attention.sparse_sink_rope: q's RoPE at load (its pair partners loaded again: L1 hits)
        q_sw = tl.load(q_ptr + qoff + ((d ^ 1) - d)[None, :], mask=hmask[:, None] & dmask[None, :], other=0.0)
        q = rotate_tail(q.to(tl.float32), q_sw.to(tl.float32), d[None, :], D, t, pos_ptr, f_ptr, HALF,
                        False).to(q_ptr.dtype.element_ty)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    if sp == 0:
        # the sink: running max = sink logit, running sum = exp(0) = 1
        m_i = tl.load(sink_ptr + h, mask=hmask, other=0.0).to(tl.float32) * 1.4426950408889634
        l_i = tl.full([BLOCK_H], 1.0, dtype=tl.float32)
    else:
        m_i = tl.full([BLOCK_H], -1.0e30, dtype=tl.float32)  # finite: exp2(m - m_new) stays defined
        l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    # The concatenated slot list [a | b] is cut into SPLITS equal ranges.
    lo = sp * per_split
    hi = lo + per_split
    m_i, l_i, acc = _attend(q, kva_ptr, idxa_ptr, t, Na, tl.minimum(lo, Na), tl.minimum(hi, Na), D, qk_scale,
                            m_i, l_i, acc, BLOCK_N, BLOCK_D, PREC)
    if HAS_B:
        m_i, l_i, acc = _attend(q, kvb_ptr, idxb_ptr, t, Nb, tl.maximum(lo - Na, 0), tl.maximum(tl.minimum(hi - Na, Nb), 0),
                                D, qk_scale, m_i, l_i, acc, BLOCK_N, BLOCK_D, PREC)
    if SPLITS == 1:
        o = acc / l_i[:, None]
        tl.store(o_ptr + qoff, o.to(o_ptr.dtype.element_ty), mask=hmask[:, None] & dmask[None, :])
    else:
        # partials: acc [SPLITS, T, H, D] fp32 in o_ptr, (m, l) [SPLITS, T, H, 2] in ml_ptr
        T = tl.num_programs(0)
        poff = ((sp * T + t).to(tl.int64) * H + h[:, None]) * D + d[None, :]
        tl.store(o_ptr + poff, acc, mask=hmask[:, None] & dmask[None, :])
        moff = ((sp * T + t).to(tl.int64) * H + h) * 2
        tl.store(ml_ptr + moff, m_i, mask=hmask)
        tl.store(ml_ptr + moff + 1, l_i, mask=hmask)


@triton.jit
def _merge_kernel(part_ptr, ml_ptr, o_ptr, T, H, D, pos_ptr, f_ptr, SPLITS: tl.constexpr, BLOCK_D: tl.constexpr,
                  ROPE_O: tl.constexpr = False, HALF: tl.constexpr = 1, PDL: tl.constexpr = 0):
    """o[t, h] = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s over the splits; with ``ROPE_O`` the inverse RoPE
    of o (rounded to o's dtype first, as the parts store it)."""
    pdl_enter(PDL)
    t = tl.program_id(0)
    h = tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    dmask = d < D
    s = tl.arange(0, SPLITS)
    moff = ((s * T + t).to(tl.int64) * H + h) * 2
    m = tl.load(ml_ptr + moff)
    l = tl.load(ml_ptr + moff + 1)
    mx = tl.max(m, axis=0)
    w = tl.exp2(m - mx)
    den = tl.sum(w * l, axis=0)
    poff = ((s[:, None] * T + t).to(tl.int64) * H + h) * D + d[None, :]
    part = tl.load(part_ptr + poff, mask=dmask[None, :], other=0.0)
    o = tl.sum(part * w[:, None], axis=0) / den
    obase = (t.to(tl.int64) * H + h) * D
    if ROPE_O:
        # the head as it is; the tail's even and odd channels merged again by the same ops (the bits o holds there),
        # rounded to o's dtype as the parts store it, then rotated back
        tl.store(o_ptr + obase + d, o.to(o_ptr.dtype.element_ty), mask=d < D - 2 * HALF)
        i = tl.arange(0, HALF)
        ca = (D - 2 * HALF) + 2 * i
        pa = ((s[:, None] * T + t).to(tl.int64) * H + h) * D + ca[None, :]
        dt = o_ptr.dtype.element_ty
        a = (tl.sum(tl.load(part_ptr + pa) * w[:, None], axis=0) / den).to(dt).to(tl.float32)
        b = (tl.sum(tl.load(part_ptr + pa + 1) * w[:, None], axis=0) / den).to(dt).to(tl.float32)
        c, sn = pair_angles(t, i, i < HALF, pos_ptr, f_ptr, True)
        tl.store(o_ptr + obase + ca, (a * c - b * sn).to(dt))
        tl.store(o_ptr + obase + ca + 1, (b * c + a * sn).to(dt))
    else:
        tl.store(o_ptr + obase + d, o.to(o_ptr.dtype.element_ty), mask=dmask)


def supports(q, kv_a, idx_a, kv_b, idx_b, sinks, scale) -> bool:
    """CUDA q [T, H, D] (fp32/bf16/fp16, 16 <= D <= 512) with caches of q's dtype, int64 index lists."""
    if not on_cuda(q, kv_a, idx_a, kv_b, idx_b, sinks):
        return False
    if q.dtype not in FLOATS or q.dim() != 3 or not 16 <= q.shape[-1] <= 512:
        return False
    caches = [kv_a] + ([kv_b] if kv_b is not None else [])
    if any(c.dtype != q.dtype or c.dim() != 2 for c in caches):
        return False
    idxs = [idx_a] + ([idx_b] if idx_b is not None else [])
    return all(i.dtype == torch.int64 and i.dim() == 2 for i in idxs)


def _check(q, kv_a, idx_a, kv_b, idx_b, sinks) -> None:
    t, h, d = q.shape
    for name, c in (("kv_a", kv_a), ("kv_b", kv_b)):
        if c is not None and c.shape[1] != d:
            raise ValueError(f"attention.sparse_sink: {name} rows have {c.shape[1]} dims, q has D={d}")
    for name, i in (("idx_a", idx_a), ("idx_b", idx_b)):
        if i is not None and i.shape[0] != t:
            raise ValueError(f"attention.sparse_sink: {name} has {i.shape[0]} rows for {t} query tokens")
    if sinks.shape != (h,):
        raise ValueError(f"attention.sparse_sink: sinks must have shape [{h}], got {tuple(sinks.shape)}")


# Batch 1-2 (``SMALL_BATCH_ROWS`` query rows): 16 heads a program, 16 slots a chunk and one chunk a split (up to
# ``SMALL_BATCH_MAX_SPLITS``), so 4 x splits programs a token share the slot list. H200, V4.1 widths (64 heads of
# 512), one call in a CUDA graph of 20 (``bench_decode_small``, twenty-fourth pass): a 128 window + 512 selected
# rows 17.1 -> 8.3 us at one token, + 32 rows 16.4 -> 6.4, the window alone 12.6 -> 5.5; at 8 tokens the old
# launch stays (it was within 4% of the best measured). ``DEEPINFER_NV_ATTN_SMALL_SPLIT=0``: the old launch
# (64 heads a program, 32-slot chunks, at least two chunks a split).
SMALL_BATCH_SPLIT = os.environ.get("DEEPINFER_NV_ATTN_SMALL_SPLIT", "1") == "1"
SMALL_BATCH_ROWS = 2
SMALL_BATCH_MAX_SPLITS = 32

# Prefill launches (>= PREFILL_ROWS query rows, 64 heads of 512 dims, 16-bit): 64 slots a chunk and a 2-deep
# pipeline of the gathered rows. At 8192 rows of a 128 window + 512 selected, H200: 3.11 ms against 4.25 ms for
# 32 slots and the default 3 stages (pass16a, docs/performance.md sixteenth pass).
PREFILL_ROWS = 512
PREFILL_STAGES = 2


def sparse_sink(q: torch.Tensor, kv_a: torch.Tensor, idx_a: torch.Tensor, kv_b: torch.Tensor | None,
                idx_b: torch.Tensor | None, sinks: torch.Tensor, scale: float,
                block_h: int | None = None, block_n: int | None = None, splits: int | None = None,
                warps: int | None = None, stages: int | None = None, rope_args: tuple | None = None) -> torch.Tensor:
    """``attention.sparse_sink`` (see the reference): returns [T, H, D] in q.dtype.

    ``block_h`` / ``block_n`` / ``splits`` / ``warps`` / ``stages`` override the launch heuristics (benchmarks
    only; ``stages`` None keeps Triton's default). ``rope_args = (positions, inv_freq)``: q comes before its
    RoPE and the output gets the inverse one (``attention.sparse_sink_rope``, through ``sparse_sink_rope``).
    """
    if not supports(q, kv_a, idx_a, kv_b, idx_b, sinks, scale):
        if rope_args is not None:  # the references of all three steps
            o = sparse_attention_sink(apply_rope(q, *rope_args), kv_a, idx_a, kv_b, idx_b, sinks, scale)
            return apply_rope(o, *rope_args, inverse=True)
        return hand_off("attention.sparse_sink", f"operands q {q.dtype} {tuple(q.shape)} on {q.device} not covered",
                        sparse_attention_sink, q, kv_a, idx_a, kv_b, idx_b, sinks, scale)
    _check(q, kv_a, idx_a, kv_b, idx_b, sinks)
    t, h, d = q.shape
    has_b = kv_b is not None and idx_b is not None and idx_b.shape[1] > 0
    na = idx_a.shape[1]
    nb = idx_b.shape[1] if has_b else 0
    out = torch.empty_like(q)
    if t == 0 or h == 0:
        return out
    q = q.contiguous()
    kv_a, idx_a = kv_a.contiguous(), idx_a.contiguous()
    if has_b:
        kv_b, idx_b = kv_b.contiguous(), idx_b.contiguous()
    block_d = next_pow2(d)
    total = na + nb
    few = SMALL_BATCH_SPLIT and t <= SMALL_BATCH_ROWS and splits is None and block_h is None and block_n is None
    # Measured on the H200 (docs/performance.md): 64 heads per program (K gathered once per token)
    # wins at prefill; 16 around batch 8 and, with the slot list cut into one-chunk splits, at batch 1-2.
    bh = block_h or (64 if (t >= 64 or (t <= 2 and not few)) and block_d <= 512 and q.dtype != torch.float32
                     else 16)
    prefill = t >= PREFILL_ROWS and bh == 64 and block_d == 512 and q.dtype != torch.float32
    bn = block_n or (16 if few else 64 if prefill else 32 if block_d >= 256 else 64)
    if stages is None and prefill:
        stages = PREFILL_STAGES
    if q.dtype == torch.float32 and block_d >= 512:
        bn = min(bn, 16)  # fp32 tiles of 512 dims: keep shared memory in bounds
    hb = triton.cdiv(h, bh)
    if splits is None:
        from deepinfer_nvidia.kernels.triton_gemm import _sm_count

        two_waves = 2 * _sm_count(q.device)  # 264 programs on the H200
        splits = 1
        if few:  # one chunk of slots a split (as many splits as chunks, to a power of two), within two waves
            while splits < min(SMALL_BATCH_MAX_SPLITS, triton.cdiv(total, bn)) and t * hb * splits * 2 <= two_waves:
                splits *= 2
        else:  # enough programs to cover the SMs at decode; none at prefill
            while t * hb * splits < two_waves and total // (splits * 2) >= 2 * bn and splits < 16:
                splits *= 2
    per_split = triton.cdiv(total, splits)
    per_split = triton.cdiv(per_split, bn) * bn
    prec = dot_precision(q.dtype)
    kvb, idxb = (kv_b, idx_b) if has_b else (kv_a, idx_a)
    opts = {"num_warps": warps or (4 if block_d <= 128 else 8)}
    if stages is not None:
        opts["num_stages"] = stages
    qk_scale = float(scale) * _LOG2E
    pos, freq = (rope_args[0].contiguous(), rope_args[1].contiguous()) if rope_args is not None else (idx_a, sinks)
    rope = {"ROPE_Q": True, "HALF": rope_args[1].shape[0]} if rope_args is not None else {}
    if splits == 1:
        _attn_kernel[(t, hb, 1)](q, kv_a, idx_a, kvb, idxb, sinks.float().contiguous(), out, out, h, d, na, nb,
                                 qk_scale, per_split, pos, freq, HAS_B=has_b, SPLITS=1, BLOCK_H=bh, BLOCK_N=bn,
                                 BLOCK_D=block_d, PREC=prec, **rope, **opts, **pdl_launch())
        if rope_args is not None:  # the output's rotation as a launch of its own: a register tile has no partners
            return triton_rope.rope(out, pos, freq, inverse=True)
        return out
    part = torch.empty(splits, t, h, d, dtype=torch.float32, device=q.device)
    ml = torch.empty(splits, t, h, 2, dtype=torch.float32, device=q.device)
    _attn_kernel[(t, hb, splits)](q, kv_a, idx_a, kvb, idxb, sinks.float().contiguous(), part, ml, h, d, na, nb,
                                  qk_scale, per_split, pos, freq, HAS_B=has_b, SPLITS=splits, BLOCK_H=bh, BLOCK_N=bn,
                                  BLOCK_D=block_d, PREC=prec, **rope, **opts, **pdl_launch())
    merge_rope = {"ROPE_O": True, "HALF": rope["HALF"]} if rope else {}
    _merge_kernel[(t, h)](part, ml, out, t, h, d, pos, freq, SPLITS=splits, BLOCK_D=block_d, **merge_rope,
                          num_warps=4, **pdl_launch())
    return out


# Heads per program in the batch-invariant launch: 16 gives 4 programs per token at H=64, the most
# parallelism available without a split at decode batch 1 (64 would be 1 program per token).
BI_BLOCK_H = 16


def sparse_sink_bi(q: torch.Tensor, kv_a: torch.Tensor, idx_a: torch.Tensor, kv_b: torch.Tensor | None,
                   idx_b: torch.Tensor | None, sinks: torch.Tensor, scale: float) -> torch.Tensor:
    """``attention.sparse_sink``, batch-invariant: q [T, H, D] -> [T, H, D] in q.dtype; ``BI_BLOCK_H`` heads
    per program, ``BLOCK_N`` from (D, dtype) only, one pass over the slots (no split, no merge)."""
    return sparse_sink(q, kv_a, idx_a, kv_b, idx_b, sinks, scale, block_h=BI_BLOCK_H, splits=1)


# attention.sparse_sink_rope: q's RoPE at load in the attention kernel, the output's inverse RoPE in the split merge
# (at 1-2 query rows the launch always splits, so a batch-1 step loses both rope launches; one-split launches keep
# a rope launch for the output). Opt-in until measured: DEEPINFER_NV_ATTN_ROPE_FUSED=1 (read at import).
ATTN_ROPE_FUSED = os.environ.get("DEEPINFER_NV_ATTN_ROPE_FUSED", "0") == "1"


def supports_rope(q, kv_a, idx_a, kv_b, idx_b, sinks, scale, positions, inv_freq) -> bool:
    """``supports``, plus what the rotation needs: integer positions [T], a float inv_freq of a power-of-two length
    (the merge's pair lanes) whose 2 x length fits D with an even number of channels before it (pairs are
    (even, odd) channels)."""
    half = inv_freq.shape[0] if inv_freq.dim() == 1 else 0
    return (supports(q, kv_a, idx_a, kv_b, idx_b, sinks, scale) and triton_rope.supports(q, positions, inv_freq)
            and half > 0 and half & (half - 1) == 0 and (q.shape[-1] - 2 * half) % 2 == 0)


def sparse_sink_rope(q: torch.Tensor, kv_a: torch.Tensor, idx_a: torch.Tensor, kv_b: torch.Tensor | None,
                     idx_b: torch.Tensor | None, sinks: torch.Tensor, scale: float, positions: torch.Tensor,
                     inv_freq: torch.Tensor, force_kernel: bool = False) -> torch.Tensor:
    """``attention.sparse_sink_rope``: q [T, H, D] before its RoPE -> [T, H, D] in q.dtype. Switched off, or for
    operands not covered, the parts (``triton_rope.rope``, ``sparse_sink``, ``rope`` inverse). ``force_kernel``
    skips the switch and the device check (Triton's interpreter, tests only)."""
    rope = triton_rope.rope
    if not (force_kernel or (ATTN_ROPE_FUSED and supports_rope(q, kv_a, idx_a, kv_b, idx_b, sinks, scale, positions,
                                                                 inv_freq))):
        o = sparse_sink(rope(q, positions, inv_freq), kv_a, idx_a, kv_b, idx_b, sinks, scale)
        return rope(o, positions, inv_freq, inverse=True)
    if positions.shape != (q.shape[0],) or 2 * inv_freq.shape[0] > q.shape[-1]:
        raise ValueError(f"attention.sparse_sink_rope: q {tuple(q.shape)} needs positions [{q.shape[0]}] and at most "
                         f"{q.shape[-1] // 2} frequencies; got {tuple(positions.shape)}, {tuple(inv_freq.shape)}")
    return sparse_sink(q, kv_a, idx_a, kv_b, idx_b, sinks, scale, rope_args=(positions, inv_freq))
