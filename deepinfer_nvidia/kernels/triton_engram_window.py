"""Triton ``engram.window`` (DeepSeek-V4.1): the n-gram window of every token of a step, one launch.

Why: the reference (``deepinfer_core/kernels/ops/engram.py:window_ids``) is ten small torch ops (two aranges, the
column positions, the in-slice test, the row clamp, the history row gather, the modulo, the column gather, the
step-row gather and the select), each a launch of a few microseconds for a few integers at decode sizes and none
in the step's programmatic-dependent-launch chain. Here one program a token computes its N columns in registers:
position p-s, from this step's row t-s while it is in the token's slice, else from the request's history ring at
``(p-s) mod C`` (a floored modulo, as ``torch.remainder``, so every read stays in the ring), and valid where
p-s >= 0. Exact integers: equal to the reference, batch-invariant as launched.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_core.kernels.ops.engram import window_ids as window_reference
from deepinfer_nvidia.kernels._common import hand_off, next_pow2, on_cuda
from deepinfer_nvidia.kernels.triton_pdl import pdl_enter, pdl_launch

MAX_NGRAM = 16  # window columns a program holds


@triton.jit
def _window_kernel(ids_ptr, pos_ptr, start_ptr, slot_ptr, hist_ptr, win_ptr, valid_ptr, N, C, stride_h,
                   NP: tl.constexpr, PDL: tl.constexpr = 0):
    """Program t: window[t, s] = ids[t - s] if p - s >= start[t] else hist[slot[t], (p - s) mod C]; valid[t, s] =
    p - s >= 0 (p = pos[t]); window [T, N] int64 and valid [T, N] bool, contiguous."""
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    s = tl.arange(0, NP)
    sm = s < N
    p = tl.load(pos_ptr + t)
    q = p - s  # [NP] position of each column
    here = q >= tl.load(start_ptr + t)
    row = tl.maximum(t - s, 0)
    mine = tl.load(ids_ptr + row, mask=sm & here, other=0)
    r = q % C
    r = tl.where(r < 0, r + C, r)  # floored, as torch.remainder: -1 -> C - 1
    past = tl.load(hist_ptr + tl.load(slot_ptr + t) * stride_h + r, mask=sm & ~here, other=0)
    tl.store(win_ptr + t * N + s, tl.where(here, mine, past), mask=sm)
    tl.store(valid_ptr + t * N + s, q >= 0, mask=sm)


def supports(input_ids, positions, start, slot, history, n) -> bool:
    """CUDA int64 ids / positions / start / slot [T] and history [S, C] (unit column stride), 1 <= n <= 16."""
    vecs = (input_ids, positions, start, slot)
    return (on_cuda(*vecs, history) and all(v.dtype == torch.int64 and v.dim() == 1 for v in vecs)
            and len({v.shape[0] for v in vecs}) == 1 and history.dtype == torch.int64 and history.dim() == 2
            and history.stride(1) == 1 and history.shape[1] > 0 and 1 <= int(n) <= MAX_NGRAM)


def window(input_ids: torch.Tensor, positions: torch.Tensor, start: torch.Tensor, slot: torch.Tensor,
           history: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``engram.window``: (window [T, n] int64, valid [T, n] bool); see the module docstring."""
    if not supports(input_ids, positions, start, slot, history, n):
        return hand_off("engram.window", f"operands {input_ids.dtype} {tuple(input_ids.shape)}, history "
                        f"{tuple(history.shape)} on {input_ids.device}, n={n} not covered", window_reference,
                        input_ids, positions, start, slot, history, n)
    return _launch(input_ids, positions, start, slot, history, int(n))


def _launch(input_ids, positions, start, slot, history, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The launch itself (the CPU interpreter tests call it on CPU tensors)."""
    t = positions.shape[0]
    win = torch.empty(t, n, dtype=torch.int64, device=positions.device)
    valid = torch.empty(t, n, dtype=torch.bool, device=positions.device)
    if t == 0:
        return win, valid
    vecs = [v.contiguous() for v in (input_ids, positions, start, slot)]
    _window_kernel[(t,)](*vecs, history, win, valid, n, history.shape[1], history.stride(0), NP=next_pow2(n),
                         num_warps=1, **pdl_launch())
    return win, valid
