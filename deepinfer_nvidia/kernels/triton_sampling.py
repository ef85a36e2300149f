"""Sampler filtering (``sample.topk_topp_minp``) without a sort: threshold searches, one program per row.

The reference sorts every row of logits ``[B, V]`` (a stable descending sort of V ~ 129k fp32 values for
DeepSeek V4) to apply min-p, top-k and top-p. All three filters keep a prefix of that sorted order, so each
is a threshold on the value plus, for top-p, a count of tied tokens at the boundary. Here one program owns
one row and streams it from global memory (L2 for small batches) several times:

1. row max ``m`` (pass 1) and softmax normaliser ``s = sum exp(x - m)`` (pass 2);
2. min-p: the probability is monotone in the logit, so the survivors are the keys ``>= k1``, the smallest
   key whose probability is not below ``min_p * max_prob`` (pass 3, only when min_p > 0);
3. top-k: ``k2``, the k-th largest surviving key, found exactly by bisection over the order-preserving
   int32 image of the fp32 values (fp32 bits with negatives flipped, ``-0.0`` folded onto ``+0.0``): each
   pass counts the keys ``>= mid``; endpoints snap to the nearest keys actually present, so it ends after
   at most 32 passes and usually far fewer (only when 0 < top_k < V);
4. top-p: renormalise over the keys ``>= k2`` (pass), then bisect for ``t``, the smallest key whose
   renormalised mass strictly above it, ``G(t)``, is < p: every key above ``t`` is kept, and of the tokens
   tied at ``t`` (ascending token id, the reference's tie order) the j-th is kept while
   ``G(t) + j * q(t) < p``, j = 0 always (only when top_p < 1);
5. write the row: kept logits unchanged, the rest ``-inf`` (last pass).

Every search is over integers, so each threshold is exact for the probabilities as computed, and those are
``exp(x - m) / s`` in fp32 like the reference's softmax (on the GPU ``exp`` is libdevice's ``expf``, the one
torch's CUDA softmax calls, and divisions are IEEE-rounded). What differs is the order of sums: ``s`` and
the top-p masses are tree sums here, the reference's own reduction and a sequential cumulative sum there.
So the masks can differ (a) at top-p's boundary token when the mass before it lands within fp32 summation
error of p (~1e-6 of the mass at V ~ 130k; a few 1e-6 against the CPU reference's sums), and (b) at a
token whose probability lands within rounding of min-p's threshold (top-p's renormalisation then moves
too). Nowhere else: ties, top-k and the tie count at the boundary follow the reference exactly.

Cost: 2 passes, +1 for min-p, + up to 32 for top-k, + 1 and up to 32 for top-p, +1 to write; no scratch.
No host synchronisation: every size is decided from shapes, data-dependent loop bounds stay on the device,
so the launch is captured in CUDA graphs. Each row's result depends on that row alone (batch-invariant).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from deepinfer_core.kernels.ops.sampling import _check_rows, topk_topp_minp as ref_filters
from deepinfer_nvidia.kernels._common import FLOATS, hand_off, next_pow2, on_cuda

_OP = "sample.topk_topp_minp"
MAX_BLOCK = 4096  # elements per streamed chunk of a row
_KEY_NEG_INF = tl.constexpr(-2139095041)  # key of -inf (0xFF800000 ^ 0x7FFFFFFF as int32): below all finite
_KEY_MAX = tl.constexpr(2147483647)


@triton.jit
def _key(x):
    """fp32 -> int32 with the same order; -0.0 maps to +0.0's key, as the reference's comparisons tie them."""
    b = tl.where(x == 0.0, 0.0, x).to(tl.int32, bitcast=True)
    return tl.where(b >= 0, b, b ^ 0x7FFFFFFF)


@triton.jit
def _exp(x, PRECISE: tl.constexpr):
    if PRECISE:
        e = libdevice.exp(x)  # __nv_expf, as torch's CUDA softmax: same bits as the reference's exp
    else:
        e = tl.exp(x)  # Triton's CPU interpreter has no libdevice
    return e


@triton.jit
def _load(x_ptr, cols, V):
    return tl.load(x_ptr + cols, mask=cols < V, other=float("-inf")).to(tl.float32)


@triton.jit
def _filter_kernel(x_ptr, k_ptr, p_ptr, minp_ptr, out_ptr, V, stride_x, stride_o,
                   BLOCK: tl.constexpr, PRECISE: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    xr = x_ptr + r * stride_x
    orow = out_ptr + r * stride_o
    lanes = tl.arange(0, BLOCK)
    top_k = tl.load(k_ptr + r).to(tl.int64)
    top_p = tl.load(p_ptr + r).to(tl.float32)
    min_p = tl.load(minp_ptr + r).to(tl.float32)

    # 1. max and normaliser, two passes so that exp(x - m) has the reference's bits (no online rescaling)
    mv = tl.full([BLOCK], float("-inf"), tl.float32)
    for c0 in range(0, V, BLOCK):
        mv = tl.maximum(mv, _load(xr, c0 + lanes, V))
    m = tl.max(mv, axis=0)
    sv = tl.zeros([BLOCK], tl.float32)
    for c0 in range(0, V, BLOCK):
        sv += _exp(_load(xr, c0 + lanes, V) - m, PRECISE)
    s = tl.sum(sv, axis=0)
    km = _key(m)

    # 2. min-p: drop prob < max_prob * min_p, max_prob = exp(0) / s. -inf logits never survive (k1 > their key).
    k1 = tl.full([], _KEY_NEG_INF + 1, tl.int32)
    if min_p > 0:
        thr = tl.math.div_rn(1.0, s) * min_p
        kv = tl.full([BLOCK], _KEY_MAX, tl.int32)
        for c0 in range(0, V, BLOCK):
            x = _load(xr, c0 + lanes, V)
            prob = tl.math.div_rn(_exp(x - m, PRECISE), s)
            kv = tl.minimum(kv, tl.where(prob < thr, _KEY_MAX, _key(x)))
        k1 = tl.maximum(k1, tl.min(kv, axis=0))

    # 3. top-k: the largest key t with #{key >= t} >= top_k; it stays k1 when fewer tokens survive (no-op).
    # Invariant: the answer lies in [lo, hi]; both ends snap to keys present in the row.
    k2 = k1
    if (top_k > 0) & (top_k < V):
        lo = k1.to(tl.int64)
        hi = km.to(tl.int64)
        while lo < hi:
            mid = lo + (hi - lo + 1) // 2  # lo < mid <= hi
            mid32 = mid.to(tl.int32)
            lo32 = lo.to(tl.int32)
            cv = tl.zeros([BLOCK], tl.int32)
            upv = tl.full([BLOCK], _KEY_MAX, tl.int32)
            downv = tl.full([BLOCK], _KEY_NEG_INF, tl.int32)
            for c0 in range(0, V, BLOCK):
                key = _key(_load(xr, c0 + lanes, V))
                ge = key >= mid32
                cv += ge.to(tl.int32)
                upv = tl.minimum(upv, tl.where(ge, key, _KEY_MAX))
                downv = tl.maximum(downv, tl.where((key >= lo32) & ~ge, key, _KEY_NEG_INF))
            ok = tl.sum(cv, axis=0) >= top_k
            lo = tl.where(ok, tl.min(upv, axis=0).to(tl.int64), lo)  # the count is the same at the next key
            hi = tl.where(ok, hi, tl.maximum(tl.max(downv, axis=0).to(tl.int64), lo))
        k2 = lo.to(tl.int32)

    # 4. top-p over the keys >= k2, renormalised. t: the smallest key in [k2 - 1, km] with G(t) < p, where
    # G(t) = mass of keys > t; G(km) = 0. t = k2 - 1 (no tied group) keeps every survivor; p >= 1 is off.
    t = k2 - 1
    g_t = tl.full([], 0.0, tl.float32)
    q_t = tl.full([], 0.0, tl.float32)
    if top_p < 1.0:
        s2v = tl.zeros([BLOCK], tl.float32)
        for c0 in range(0, V, BLOCK):
            x = _load(xr, c0 + lanes, V)
            s2v += tl.where(_key(x) >= k2, _exp(x - m, PRECISE), 0.0)
        s2 = tl.sum(s2v, axis=0)
        lo = (k2 - 1).to(tl.int64)
        hi = km.to(tl.int64)
        g_hi = tl.full([], 0.0, tl.float32)  # G(hi), kept with hi
        while lo < hi:
            mid = lo + (hi - lo) // 2  # lo <= mid < hi
            mid32 = mid.to(tl.int32)
            lo32 = lo.to(tl.int32)
            hi32 = hi.to(tl.int32)
            gv = tl.zeros([BLOCK], tl.float32)
            upv = tl.full([BLOCK], _KEY_MAX, tl.int32)
            downv = tl.full([BLOCK], _KEY_NEG_INF, tl.int32)
            for c0 in range(0, V, BLOCK):
                x = _load(xr, c0 + lanes, V)
                key = _key(x)
                gt = key > mid32  # implies key >= k2: a survivor
                gv += tl.where(gt, tl.math.div_rn(_exp(x - m, PRECISE), s2), 0.0)
                upv = tl.minimum(upv, tl.where(gt & (key <= hi32), key, _KEY_MAX))
                downv = tl.maximum(downv, tl.where((key > lo32) & ~gt, key, _KEY_NEG_INF))
            g = tl.sum(gv, axis=0)
            below = g < top_p
            # G is constant between neighbouring keys, so the answer is lo or a key present in the row
            hi_new = tl.maximum(tl.max(downv, axis=0).to(tl.int64), lo)
            lo = tl.where(below, lo, tl.minimum(tl.min(upv, axis=0).to(tl.int64), hi))
            hi = tl.where(below, hi_new, hi)
            g_hi = tl.where(below, g, g_hi)
        t = hi.to(tl.int32)
        g_t = g_hi
        tb = tl.where(t >= 0, t, t ^ 0x7FFFFFFF)  # the key's fp32 value
        q_t = tl.math.div_rn(_exp(tb.to(tl.float32, bitcast=True) - m, PRECISE), s2)

    # 5. write: keys > t kept; ties at t kept in ascending id order while the mass before them stays < p
    n_ties = tl.full([], 0, tl.int32)
    for c0 in range(0, V, BLOCK):
        cols = c0 + lanes
        x = _load(xr, cols, V)
        key = _key(x)
        surv = key >= k2
        tie = surv & (key == t)
        j = n_ties + tl.cumsum(tie.to(tl.int32), axis=0) - 1
        tie_kept = tie & ((j == 0) | (g_t + j.to(tl.float32) * q_t < top_p))
        keep = (surv & (key > t)) | tie_kept
        out = tl.where(keep, x, float("-inf"))
        tl.store(orow + cols, out.to(out_ptr.dtype.element_ty), mask=cols < V)
        n_ties += tl.sum(tie.to(tl.int32), axis=0)


def _covered(logits: torch.Tensor) -> bool:
    return (isinstance(logits, torch.Tensor) and logits.dtype in FLOATS and logits.dim() == 2
            and logits.shape[1] > 0)


# Rows from which the kernel runs. One program walks a whole row (~70 passes with every filter on), so a small
# batch leaves most SMs idle. H200, V 129280 (docs/performance.md, tenth pass): at B=1 530 us against the
# reference's 285, at B=8 0.55-0.91x, at B=64 1.4-1.7x, at B=256 2.7-3.4x. Smaller batches run the reference.
MIN_ROWS = 64


def supports_filters(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor) -> bool:
    """CUDA logits [B, V] (fp32/bf16/fp16, V > 0) with CUDA per-row parameters."""
    return on_cuda(logits, top_k, top_p, min_p) and _covered(logits)


def topk_topp_minp(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor,
                   force_kernel: bool = False) -> torch.Tensor:
    """``sample.topk_topp_minp``: logits [B, V] (fp32/bf16/fp16), top_k [B] int, top_p [B] and min_p [B]
    float -> a new [B, V] tensor of logits' dtype, filtered-out tokens -inf, kept ones unchanged.
    ``force_kernel`` runs the kernel on CPU tensors (Triton's interpreter, tests only)."""
    if not force_kernel and supports_filters(logits, top_k, top_p, min_p) and logits.shape[0] < MIN_ROWS:
        return ref_filters(logits, top_k, top_p, min_p)  # measured faster there (MIN_ROWS)
    if not (supports_filters(logits, top_k, top_p, min_p) or (force_kernel and _covered(logits))):
        return hand_off(_OP, f"logits {getattr(logits, 'dtype', None)} on {getattr(logits, 'device', None)} "
                        "not covered", ref_filters, logits, top_k, top_p, min_p)
    _check_rows(_OP, logits, top_k=top_k, top_p=top_p, min_p=min_p)  # the reference's errors
    b, v = logits.shape
    out = torch.empty(b, v, dtype=logits.dtype, device=logits.device)
    if b == 0:
        return out
    x = logits if logits.stride(1) == 1 else logits.contiguous()
    block = min(next_pow2(v), MAX_BLOCK)
    _filter_kernel[(b,)](x, top_k.contiguous(), top_p.contiguous(), min_p.contiguous(), out, v, x.stride(0),
                         out.stride(0), BLOCK=block, PRECISE=x.is_cuda, num_warps=8 if block >= 2048 else 4)
    return out
