"""Triton ``engram.hash_ids`` (DeepSeek-V4.1): every n-gram hash of each token, one launch.

The reference (``deepinfer_core/kernels/ops/engram.py:hash_ids``) is about a dozen small torch ops (a cumulative
product for the blocked columns, the token-map gather, the multiply, N-1 rolling XORs, N-1 modulos, a concat
and the offsets), each a kernel launch of a few microseconds for a handful of integers at decode sizes. Here one
program per (token, Engram layer) does it all in registers: the N window columns (blocked from the first
invalid one on), their compressed ids through ``token_map``, the products with the layer's odd multipliers, and
for every output column ``c = (s-1)*H + h`` the XOR of products 0..s modulo its prime plus its offset.

Exact integer math, so any launch equals the reference bit for bit (batch-invariant as launched). The products
are int64 as in the reference (the multipliers are chosen so they stay below 2^63).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_core.kernels.ops.engram import hash_ids as hash_ids_reference
from deepinfer_nvidia.kernels._common import hand_off, next_pow2, on_cuda
from deepinfer_nvidia.kernels.triton_pdl import pdl_enter, pdl_launch

MAX_NGRAM = 16  # window columns a program holds (the model keeps HISTORY_CAP = 16 positions)
MAX_COLS = 1024  # output columns (N-1)*H a program holds


@triton.jit
def _hash_kernel(win_ptr, valid_ptr, map_ptr, mult_ptr, prime_ptr, off_ptr, out_ptr, N, V, H, C, L, pad_id,
                 NP: tl.constexpr, CP: tl.constexpr, PDL: tl.constexpr = 0):
    """Program (token t, layer l): out[t, l, c] = (xor_{s <= c // H + 1} v_s * mult[l, s]) % prime[l, c] + off[l, c]
    with v_s = pad_id from the first invalid window column on, token_map[window[t, s]] before it."""
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    lay = tl.program_id(1).to(tl.int64)
    s = tl.arange(0, NP)
    sm = s < N
    w = tl.load(win_ptr + t * N + s, mask=sm, other=0)
    invalid = tl.load(valid_ptr + t * N + s, mask=sm, other=1) == 0
    # blocked[s]: some column s' <= s is invalid (the reference's cumulative product of valid)
    upto = s[None, :] <= s[:, None]  # [s, s']
    blocked = tl.max(tl.where(upto & invalid[None, :], 1, 0), axis=1) > 0
    mapped = tl.load(map_ptr + tl.minimum(tl.maximum(w, 0), V - 1), mask=sm, other=0)
    v = tl.where(blocked, pad_id, mapped)
    prod = v * tl.load(mult_ptr + lay * N + s, mask=sm, other=0)  # [NP] int64
    prod = tl.where(sm, prod, 0)
    c = tl.arange(0, CP)
    cm = c < C
    last = c // H + 1  # column c's n-gram covers window columns 0 .. last
    rolling = tl.xor_sum(tl.where(s[None, :] <= last[:, None], prod[None, :], 0), axis=1)  # [CP]
    prime = tl.load(prime_ptr + lay * C + c, mask=cm, other=1)
    off = tl.load(off_ptr + lay * C + c, mask=cm, other=0)
    tl.store(out_ptr + (t * L + lay) * C + c, rolling % prime + off, mask=cm)


def _covered(window, valid, token_map, multipliers, primes, offsets) -> bool:
    if window.dim() != 2 or valid.shape != window.shape or multipliers.dim() != 2 or primes.dim() != 2:
        return False
    n = window.shape[1]
    nl, cols = primes.shape
    return (window.dtype == token_map.dtype == multipliers.dtype == primes.dtype == offsets.dtype == torch.int64
            and valid.dtype == torch.bool and 2 <= n <= MAX_NGRAM and tuple(multipliers.shape) == (nl, n)
            and tuple(offsets.shape) == (nl, cols) and cols % (n - 1) == 0 and 0 < cols <= MAX_COLS
            and token_map.dim() == 1 and token_map.numel() > 0)


def supports_hash(window, valid, token_map, pad_id, multipliers, primes, offsets) -> bool:
    """CUDA int64 window / token_map / multipliers / primes / offsets and a bool valid of the reference's shapes,
    N <= 16 window columns and (N-1)*H <= 1024 output columns."""
    return (on_cuda(window, valid, token_map, multipliers, primes, offsets)
            and _covered(window, valid, token_map, multipliers, primes, offsets))


def hash_ids(window: torch.Tensor, valid: torch.Tensor, token_map: torch.Tensor, pad_id: int,
             multipliers: torch.Tensor, primes: torch.Tensor, offsets: torch.Tensor,
             force_kernel: bool = False) -> torch.Tensor:
    """``engram.hash_ids``: window [T, N] int64, valid [T, N] bool, token_map [V] int64, multipliers [L, N],
    primes / offsets [L, (N-1)*H] int64 -> int64 [T, L, (N-1)*H] (see the reference). ``force_kernel`` runs on
    CPU tensors (Triton's interpreter, tests only)."""
    args = (window, valid, token_map, pad_id, multipliers, primes, offsets)
    if not (supports_hash(*args) or force_kernel and _covered(window, valid, token_map, multipliers, primes, offsets)):
        return hand_off("engram.hash_ids", f"operands {window.dtype} {tuple(window.shape)} on {window.device} not "
                        "covered", hash_ids_reference, *args)
    t, n = window.shape
    nl, cols = primes.shape
    out = torch.empty(t, nl, cols, dtype=torch.int64, device=window.device)
    if t == 0 or nl == 0:
        return out
    _hash_kernel[(t, nl)](window.contiguous(), valid.contiguous().view(torch.uint8), token_map.contiguous(),
                          multipliers.contiguous(), primes.contiguous(), offsets.contiguous(), out, n,
                          token_map.numel(), cols // (n - 1), cols, nl, int(pad_id), NP=next_pow2(n),
                          CP=next_pow2(cols), num_warps=1, **pdl_launch())
    return out
