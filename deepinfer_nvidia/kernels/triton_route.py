"""Triton MoE routing (``moe.route_topk``, ``moe.route_hash``): one launch per MoE layer instead of ~10 torch ops.

One program per token: it reads the token's router logits [E] once, forms ``sqrt(softplus(x))`` and, for
``route_topk``, selects the k experts by k rounds of arg-max over the biased scores (one int64 max per round
over the keys packed with their ids), then writes the normalised, scaled weights and the ids.
``route_hash`` reads only the k logits its fixed ids name.

Precision follows the reference (``deepinfer_core/kernels/ops/moe.py``): softplus in fp64 (``up``), rounded to
fp32 (``down``), then a correctly rounded fp32 sqrt (as CUDA's; torch's fp32 CPU sqrt is not: ~20% of values
1 ulp off here), so the scores are those bits except within one fp64 ulp of an fp32 rounding boundary, and
the selection differs from the reference's only at ties within an ulp. The weight division is correctly
rounded too (``div_rn``); only the order of the k-term fp32 sum differs.

Ties: ``torch.topk`` does not specify which of equal scores it returns (the comparator ``_compare_route``
compares id sets); here the LOWER expert id wins an exact tie, and ids come out in descending biased-score
order. NaN scores rank above everything, as in ``torch.topk``.

Batch-invariant: one program per token with a block size taken from E only. No host synchronisation, so the
launch is captured with the decode step. Covered: CUDA fp32/bf16/fp16 logits [T, E <= 4096] with a float bias
[E], 1 <= k <= 32 (route_topk); integer ids [T, k <= 64] (route_hash). The rest goes to the reference, which
also raises the reference's errors for malformed operands. ``force_kernel=True`` skips the device check only
(tests run the kernels on CPU tensors in Triton's interpreter).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from deepinfer_core.kernels.ops.moe import route_hash as ref_hash, route_topk as ref_topk
from deepinfer_nvidia.kernels._common import FLOATS, hand_off, next_pow2, on_cuda
from deepinfer_nvidia.kernels.triton_pdl import pdl_enter, pdl_launch

_MAX_E = 4096
_MAX_K = 32
_MAX_HASH_K = 64
_INTS = (torch.int64, torch.int32, torch.int16)


# Warps of a ``route_topk`` program (``DEEPINFER_NV_ROUTE_WARPS``; 0: ``_warps``' rule from E). Taken from E or this
# knob only, never from T, so a token's program is the same in any batch (the op is registered batch-invariant).
ROUTE_WARPS = int(os.environ.get("DEEPINFER_NV_ROUTE_WARPS", "0"))


def _warps(block: int) -> int:
    # H200, E = 384 (block 512), T = 8192: 1 / 2 / 4 / 8 warps ran 66 / 56 / 56 / 80 us (fp64 softplus bound);
    # H100, T = 1, a call in a graph ring: 7.69 / 5.37 / 4.14 / 3.92 us (docs/performance.md, thirty-fourth pass)
    return ROUTE_WARPS or max(1, min(4, block // 128))


@triton.jit
def _sqrtsoftplus(x):
    """``sqrt(softplus(x))`` as the reference forms it: torch's softplus (threshold 20) in fp64, rounded to
    fp32, then a correctly rounded sqrt. log1p(u) is Goldberg's ``log(v) * u / (v - 1)``, v = 1 + u, which is
    accurate to a few fp64 ulps (tl.log1p does not exist; libdevice is not available in the interpreter)."""
    xd = x.to(tl.float64)
    u = tl.exp(tl.where(xd > 20.0, 20.0, xd))  # where, not minimum: a NaN logit must stay NaN
    v = 1.0 + u
    l1p = tl.where(v == 1.0, u, tl.log(v) * (u / tl.where(v == 1.0, 1.0, v - 1.0)))  # no 0/0 lanes
    sp = tl.where(xd > 20.0, xd, l1p)
    return tl.sqrt_rn(sp.to(tl.float32))


@triton.jit
def _route_keys(s, bias):
    """The selection keys of scores ``s``: s + bias (the bias only picks, never weighs), NaN as +inf (it ranks
    first, as in torch.topk) and -0.0 as +0.0 (they tie)."""
    key = s + bias
    key = tl.where(key != key, float("inf"), key)
    return tl.where(key == 0.0, 0.0, key)


@triton.jit
def _select_topk(key, e, valid, K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr):
    """The ids of the K largest ``key`` lanes (``e`` the lane ids, ``valid`` the real ones) in descending key order,
    [BLOCK_K] int64 (lanes >= K: 0). One int64 max per round picks the largest key and, among equal keys, the lowest
    id: the high word is the key's bits made order-preserving as a signed int, the low word BLOCK_E - 1 - e."""
    bits = key.to(tl.int32, bitcast=True)
    bits = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    packed = (bits.to(tl.int64) << 32) + (BLOCK_E - 1 - e).to(tl.int64)
    floor = -9223372036854775807 - 1  # below every valid lane, -inf keys included
    packed = tl.where(valid, packed, floor)
    j = tl.arange(0, BLOCK_K)
    sel = tl.zeros([BLOCK_K], dtype=tl.int64)
    for i in tl.static_range(K):
        best = tl.max(packed, axis=0)
        idx = BLOCK_E - 1 - (best - ((best >> 32) << 32))  # the low word (>> is arithmetic)
        sel = tl.where(j == i, idx, sel)
        packed = tl.where(e == idx, floor, packed)  # taken: below every lane still in play
    return sel


@triton.jit
def _route_weights(s, jm, scaling):
    """The selected scores ``s`` [BLOCK_K] (lanes outside ``jm`` ignored) normalised and scaled (correctly rounded)."""
    s = tl.where(jm, s, 0.0)
    total = tl.sum(s, axis=0) + 1e-20
    return tl.math.div_rn(s, tl.zeros_like(s) + total) * scaling


@triton.jit
def _route_row(row, b_ptr, w_ptr, ids_ptr, E, scaling, K: tl.constexpr, BLOCK_E: tl.constexpr,
               BLOCK_K: tl.constexpr):
    """One token's logits at ``row`` [E] -> its K weights (fp32) and ids (int64) stored at ``w_ptr`` / ``ids_ptr``;
    returns the ids [BLOCK_K] (lanes >= K: 0) in descending biased-score order."""
    e = tl.arange(0, BLOCK_E)
    valid = e < E
    key = _route_keys(_sqrtsoftplus(tl.load(row + e, mask=valid, other=0.0).to(tl.float32)),
                      tl.load(b_ptr + e, mask=valid, other=0.0).to(tl.float32))
    sel = _select_topk(key, e, valid, K, BLOCK_E, BLOCK_K)
    j = tl.arange(0, BLOCK_K)
    jm = j < K
    # the selected scores again from their k logits (cache hits): the same function, the same bits
    s = _sqrtsoftplus(tl.load(row + sel, mask=jm, other=0.0).to(tl.float32))
    tl.store(w_ptr + j, _route_weights(s, jm, scaling), mask=jm)
    tl.store(ids_ptr + j, sel, mask=jm)
    return sel


@triton.jit
def _topk_kernel(x_ptr, b_ptr, w_ptr, ids_ptr, E, x_stride, scaling,
                 K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr = 0):
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    _route_row(x_ptr + t * x_stride, b_ptr, w_ptr + t * K, ids_ptr + t * K, E, scaling, K, BLOCK_E, BLOCK_K)


@triton.jit
def _hash_kernel(x_ptr, id_ptr, w_ptr, E, K, x_stride, id_stride, scaling, BLOCK_K: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, BLOCK_K)
    jm = j < K
    e = tl.load(id_ptr + t * id_stride + j, mask=jm, other=0).to(tl.int64)
    ok = jm & (e >= 0) & (e < E)  # an id outside [0, E) is never dereferenced: its weight is NaN
    s = _sqrtsoftplus(tl.load(x_ptr + t * x_stride + e, mask=ok, other=0.0).to(tl.float32))
    s = tl.where(ok, s, float("nan"))
    s = tl.where(jm, s, 0.0)
    total = tl.sum(s, axis=0) + 1e-20
    w = tl.math.div_rn(s, tl.zeros_like(s) + total) * scaling
    tl.store(w_ptr + t * K + j, w, mask=jm)


def _is_scalar(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _route_uncovered(logits, bias, top_k, scaling, force: bool) -> str | None:
    if not (force or on_cuda(logits, bias)):
        return "operands not on a CUDA device"
    if not (isinstance(logits, torch.Tensor) and isinstance(bias, torch.Tensor) and logits.dim() == 2
            and bias.dim() == 1 and logits.dtype in FLOATS and bias.dtype in FLOATS
            and bias.shape[0] == logits.shape[1] and 0 < logits.shape[1] <= _MAX_E):
        return "logits / bias shapes or dtypes not covered"
    if not (isinstance(top_k, int) and 1 <= top_k <= min(_MAX_K, logits.shape[1]) and _is_scalar(scaling)):
        return "top_k / scaling not covered"
    return None


def supports_route(logits: torch.Tensor, bias: torch.Tensor, top_k: int, scaling: float) -> bool:
    """CUDA float logits [T, E <= 4096], float bias [E], int 1 <= top_k <= min(32, E), a Python scaling."""
    return _route_uncovered(logits, bias, top_k, scaling, False) is None


def route_topk(logits: torch.Tensor, bias: torch.Tensor, top_k: int, scaling: float, *,
               force_kernel: bool = False, warps: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``moe.route_topk``: logits [T, E], bias [E] -> (weights [T, k] fp32, ids [T, k] int64). ``warps``
    overrides the program's warp count (benchmarks)."""
    why = _route_uncovered(logits, bias, top_k, scaling, force_kernel)
    if why:
        return hand_off("moe.route_topk", why, ref_topk, logits, bias, top_k, scaling)
    t, e = logits.shape
    w = torch.empty(t, top_k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(t, top_k, dtype=torch.long, device=logits.device)
    if t == 0:
        return w, ids
    x = logits if logits.stride(1) == 1 else logits.contiguous()
    block = next_pow2(e)
    _topk_kernel[(t,)](x, bias.contiguous(), w, ids, e, x.stride(0), float(scaling), K=top_k, BLOCK_E=block,
                       BLOCK_K=next_pow2(top_k), num_warps=warps or _warps(block), **pdl_launch())
    return w, ids


def _hash_uncovered(logits, ids, scaling, force: bool) -> str | None:
    if not (force or on_cuda(logits, ids)):
        return "operands not on a CUDA device"
    if not (isinstance(logits, torch.Tensor) and isinstance(ids, torch.Tensor) and logits.dim() == 2
            and ids.dim() == 2 and logits.dtype in FLOATS and ids.dtype in _INTS
            and ids.shape[0] == logits.shape[0] and 1 <= ids.shape[1] <= _MAX_HASH_K and _is_scalar(scaling)):
        return "logits / ids shapes or dtypes not covered"
    return None


def supports_hash(logits: torch.Tensor, ids: torch.Tensor, scaling: float) -> bool:
    """CUDA float logits [T, E], integer ids [T, 1 <= k <= 64], a Python scaling."""
    return _hash_uncovered(logits, ids, scaling, False) is None


def route_hash(logits: torch.Tensor, ids: torch.Tensor, scaling: float, *,
               force_kernel: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``moe.route_hash``: logits [T, E], ids [T, k] -> (weights [T, k] fp32, ids.long()).

    Ids must lie in [0, E) as for the reference's gather; an id outside gets a NaN weight here (no wild read,
    and no host check that would synchronise)."""
    why = _hash_uncovered(logits, ids, scaling, force_kernel)
    if why:
        return hand_off("moe.route_hash", why, ref_hash, logits, ids, scaling)
    t, k = ids.shape
    w = torch.empty(t, k, dtype=torch.float32, device=logits.device)
    if t == 0:
        return w, ids.long()
    x = logits if logits.stride(1) == 1 else logits.contiguous()
    i = ids if ids.stride(1) == 1 else ids.contiguous()
    _hash_kernel[(t,)](x, i, w, x.shape[1], k, x.stride(0), i.stride(0), float(scaling), BLOCK_K=next_pow2(k),
                       num_warps=1)
    return w, ids.long()
