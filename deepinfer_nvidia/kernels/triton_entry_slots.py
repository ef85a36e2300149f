"""Triton ``index.entry_slots``: the cache slots of the top-k selected compressed entries, one launch.

Why: every compressed attention layer turns the shared top-k positions into its own cache's slots before its
attention reads them. Written as torch ops (``deepinfer_core.kernels.ops.indexer.entry_slots``) that is five small
kernels a layer (compare, clamp, gather, fill, select) outside the decode step's programmatic-dependent-launch
chain: 30 of them in the 8-layer V4.1 slice at batch 1 (6 compressed layers). Here one program maps ``BLOCK``
selections of one row: exact integers, each output from its own row, so batch-invariant.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_core.kernels.ops.indexer import entry_slots as entry_slots_reference
from deepinfer_nvidia.kernels._common import hand_off, on_cuda
from deepinfer_nvidia.kernels.triton_pdl import pdl_enter, pdl_launch

BLOCK = 512  # selections a program: one program a row at V4.1's index_topk of 512


@triton.jit
def _entry_slots_kernel(vis_ptr, sel_ptr, out_ptr, n, k, stride_v, stride_s, BLOCK: tl.constexpr,
                        PDL: tl.constexpr = 0):
    """Program (row, selection block): ``out[t, j] = vis[t, sel[t, j]]`` where ``0 <= sel < n``, else -1; ``out``
    contiguous [T, k] int64. A position at or past n reads nothing (it maps to -1; the reference requires < n)."""
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < k
    pos = tl.load(sel_ptr + row * stride_s + cols, mask=mask, other=-1)
    live = mask & (pos >= 0) & (pos < n)
    slot = tl.load(vis_ptr + row * stride_v + pos, mask=live, other=-1)
    tl.store(out_ptr + row * k + cols, tl.where(live, slot, -1).to(tl.int64), mask=mask)


def supports(visible: torch.Tensor, sel: torch.Tensor) -> bool:
    """CUDA int64 visible [T, N] and sel [T, k] with unit column strides (any row stride)."""
    return (on_cuda(visible, sel) and visible.dtype == torch.int64 and sel.dtype == torch.int64
            and visible.dim() == 2 and sel.dim() == 2 and visible.shape[0] == sel.shape[0]
            and (visible.stride(1) == 1 or visible.shape[1] <= 1) and (sel.stride(1) == 1 or sel.shape[1] <= 1))


def entry_slots(visible: torch.Tensor, sel: torch.Tensor) -> torch.Tensor:
    """``index.entry_slots``: visible [T, N], sel [T, k] int64 -> [T, k] int64 (see the module docstring)."""
    if not supports(visible, sel):
        return hand_off("index.entry_slots", f"operands {visible.dtype}/{sel.dtype} {tuple(visible.shape)}/"
                        f"{tuple(sel.shape)} on {visible.device} not covered", entry_slots_reference, visible, sel)
    return _launch(visible, sel)


def _launch(visible: torch.Tensor, sel: torch.Tensor) -> torch.Tensor:
    """The launch itself (the CPU interpreter tests call it on CPU tensors)."""
    t, k = sel.shape
    out = torch.empty(t, k, dtype=torch.int64, device=sel.device)
    if t == 0 or k == 0:
        return out
    _entry_slots_kernel[(t, triton.cdiv(k, BLOCK))](visible, sel, out, visible.shape[1], k, visible.stride(0),
                                                    sel.stride(0), BLOCK=BLOCK, num_warps=4, **pdl_launch())
    return out
