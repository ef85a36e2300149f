"""``kv.sliding_slots`` / ``kv.compressed_slots``: a step's per-group slot metadata in one launch per group.

The references (``deepinfer_core/kernels/ops/kv.py``) are ~12-16 torch ops per group. Inside a captured decode
step each is a kernel launch of its own (~130 per V4.1 step; ``benchmarks/step_glue_ops.py``). Here one program
per (token, column tile) reads the token's request row of the block table and writes its read rows. The first
column tile also writes the token's write row. Integer math only, so the result is exact. There are no host
synchronisations, so the launch is captured with the step.

Not batch-invariant-flagged (no row test): batch-invariant mode keeps the references, which produce the same
integers.
"""
from __future__ import annotations

import logging

import torch
import triton
import triton.language as tl
from triton.compiler.errors import CompilationError

from deepinfer_core.kernels.ops.kv import _check, compressed_slots as ref_compressed, sliding_slots as ref_sliding

logger = logging.getLogger(__name__)
_BLOCK = 128
_FAILED: set[str] = set()  # ops whose kernel failed to compile here: they run the reference from then on


@triton.jit
def _sliding_kernel(table_ptr, seq_ptr, pos_ptr, nwb_ptr, floor_ptr, w_ptr, r_ptr, W_TAB, bs, window,
                    BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    cb = tl.program_id(1)
    p = tl.load(pos_ptr + t).to(tl.int64)
    fl = tl.load(floor_ptr + t).to(tl.int64)
    row = table_ptr + tl.load(seq_ptr + t).to(tl.int64) * W_TAB
    if cb == 0:
        own = tl.load(row + p // bs).to(tl.int64) * bs + p % bs
        no_write = tl.where(fl > 0, 0, tl.load(nwb_ptr + t).to(tl.int64))  # a floored request rewrites its window
        tl.store(w_ptr + t, tl.where(p < no_write, -1, own))
    j = (cb * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)
    jm = j < window
    q = p - (window - 1) + j  # column j: position p - W + 1 + j
    qc = tl.maximum(q, 0)
    rows = tl.load(row + qc // bs, mask=jm, other=0).to(tl.int64) * bs + qc % bs
    tl.store(r_ptr + t * window + j, tl.where(q >= fl, rows, -1), mask=jm)


@triton.jit
def _compressed_kernel(table_ptr, seq_ptr, pos_ptr, nwb_ptr, w_ptr, r_ptr, W_TAB, ratio, epb, bs, width,
                       BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    cb = tl.program_id(1)
    p = tl.load(pos_ptr + t).to(tl.int64)
    row = table_ptr + tl.load(seq_ptr + t).to(tl.int64) * W_TAB
    last = W_TAB - 1
    if cb == 0:
        e = p // ratio
        own = tl.load(row + tl.minimum(e * ratio // bs, last)).to(tl.int64) * epb + e % epb
        closes = ((p + 1) % ratio == 0) & (p >= tl.load(nwb_ptr + t).to(tl.int64))
        tl.store(w_ptr + t, tl.where(closes, own, -1))
    g = (cb * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)
    gm = g < width
    rows = tl.load(row + tl.minimum(g * ratio // bs, last), mask=gm, other=0).to(tl.int64) * epb + g % epb
    tl.store(r_ptr + t * width + g, tl.where(g < (p + 1) // ratio, rows, -1), mask=gm)


def _on_cuda(*ts: torch.Tensor) -> bool:
    return all(isinstance(x, torch.Tensor) and x.is_cuda for x in ts)


def supports_sliding(table, seq, pos, no_write_before, floor, block_size, window) -> bool:
    return _on_cuda(table, seq, pos, no_write_before, floor)


def supports_compressed(table, seq, pos, no_write_before, ratio, entries_per_block, block_size, width) -> bool:
    return _on_cuda(table, seq, pos, no_write_before)


def _launch(name: str, kernel, grid, args, ref, ref_args):
    """Launch, or (once a compile error was seen for ``name``) run the reference: a kernel that does not build
    on this GPU / Triton costs speed, never a step."""
    if name in _FAILED:
        return ref(*ref_args)
    try:
        kernel[grid](*args, BLOCK=_BLOCK, num_warps=4)
    except CompilationError as exc:
        _FAILED.add(name)
        logger.warning("%s: the Triton kernel did not compile (%s); using the torch reference", name, exc)
        return ref(*ref_args)
    return None


def sliding_slots(table, seq, pos, no_write_before, floor, block_size, window):
    """``kv.sliding_slots`` on CUDA: (writes [T], reads [T, window]) int64."""
    _check("kv.sliding_slots", table, seq, pos, no_write_before, floor)
    if block_size < 1 or window < 1:
        return ref_sliding(table, seq, pos, no_write_before, floor, block_size, window)  # raises the error
    t, dev = pos.shape[0], pos.device
    writes = torch.empty(t, dtype=torch.long, device=dev)
    reads = torch.empty(t, int(window), dtype=torch.long, device=dev)
    if t == 0:
        return writes, reads
    table = table.contiguous()
    grid = (t, triton.cdiv(int(window), _BLOCK))
    out = _launch("kv.sliding_slots", _sliding_kernel, grid,
                  (table, seq.contiguous(), pos.contiguous(), no_write_before.contiguous(), floor.contiguous(),
                   writes, reads, table.shape[1], int(block_size), int(window)),
                  ref_sliding, (table, seq, pos, no_write_before, floor, block_size, window))
    return out if out is not None else (writes, reads)


def compressed_slots(table, seq, pos, no_write_before, ratio, entries_per_block, block_size, width):
    """``kv.compressed_slots`` on CUDA: (writes [T], reads [T, width]) int64."""
    _check("kv.compressed_slots", table, seq, pos, no_write_before)
    if ratio < 1 or entries_per_block < 1 or block_size < 1 or width < 0:
        return ref_compressed(table, seq, pos, no_write_before, ratio, entries_per_block, block_size, width)
    t, dev = pos.shape[0], pos.device
    writes = torch.empty(t, dtype=torch.long, device=dev)
    reads = torch.empty(t, int(width), dtype=torch.long, device=dev)
    if t == 0:
        return writes, reads
    table = table.contiguous()
    grid = (t, max(1, triton.cdiv(int(width), _BLOCK)))  # column tile 0 also writes ``writes``
    out = _launch("kv.compressed_slots", _compressed_kernel, grid,
                  (table, seq.contiguous(), pos.contiguous(), no_write_before.contiguous(), writes, reads,
                   table.shape[1], int(ratio), int(entries_per_block), int(block_size), int(width)),
                  ref_compressed, (table, seq, pos, no_write_before, ratio, entries_per_block, block_size, width))
    return out if out is not None else (writes, reads)
