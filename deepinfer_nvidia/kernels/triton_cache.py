"""Triton ``cache.write_rows``: the masked row store of every KV / state cache write, in one launch.

The reference (``deepinfer_core/kernels/ops/cache.py``) needs ~13 small torch ops to stay free of
host syncs (argmax / where / arange / cat / index / index_put_); a graphed decode step runs it ~16
times. Here one program stores ``ROWS`` rows x ``BLOCK`` columns: it loads each row's slot and keep
flag (``slot >= 0`` when no keep mask is given), and a kept row is cast to the cache dtype in
registers and stored at its slot under a mask. Rows not kept store nothing, so there is no
redirection trick and no host sync: the launch is capturable in a CUDA graph, and a replay with new
slot values writes the new slots.

Batch-invariant: every element is copied on its own (no reduction), so a row's bits never depend on
the other rows of the call. The fp32 -> bf16/fp16 cast is round-to-nearest-even, as ``Tensor.to``.

Covered: CUDA tensors; cache / rows of fp32, bf16, fp16 or int64 / int32 (a float row into a float
cache or an int row into an int cache); a cache whose row ([*E]) is contiguous, any row stride
(``ring.view(-1, E)`` and ``history.view(-1)`` as the models pass them). Anything else runs the
reference (one logged hand-off per reason); contract violations raise the reference's errors.
Kept slots outside [0, N) are skipped (the reference would raise or wrap): never a wild store.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from deepinfer_core.kernels.ops.cache import check_write_rows, write_rows as write_rows_reference
from deepinfer_nvidia.kernels._common import hand_off, next_pow2, on_cuda
from deepinfer_nvidia.kernels.triton_pdl import pdl_enter, pdl_launch

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_INTS = (torch.int64, torch.int32)
# Elements one program stores: enough work per program for wide rows (SWA entries are 512 wide),
# several rows per program for narrow ones (scalar token ids of the Engram history).
_TILE = 2048
_MAX_BLOCK = 1024


@triton.jit
def _write_rows_kernel(cache_ptr, slots_ptr, rows_ptr, keep_ptr, n_rows, n_slots, row_len, cache_stride,
                       slots_stride, rows_stride, keep_stride, HAS_KEEP: tl.constexpr, ROWS: tl.constexpr,
                       BLOCK: tl.constexpr, PDL: tl.constexpr = 0):
    pdl_enter(PDL)
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # the rows (of K) this program stores
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)  # the columns (of the flattened row E)
    rmask = r < n_rows
    slot = tl.load(slots_ptr + r * slots_stride, mask=rmask, other=-1).to(tl.int64)
    if HAS_KEEP:
        kept = tl.load(keep_ptr + r * keep_stride, mask=rmask, other=0) != 0
    else:
        kept = slot >= 0
    # a kept slot outside the cache is a contract violation: skip it rather than store out of bounds
    kept = kept & rmask & (slot >= 0) & (slot < n_slots)
    mask = kept[:, None] & (c < row_len)[None, :]
    src = r.to(tl.int64)[:, None] * rows_stride + c[None, :]
    v = tl.load(rows_ptr + src, mask=mask)
    dst = slot[:, None] * cache_stride + c[None, :]
    tl.store(cache_ptr + dst, v.to(cache_ptr.dtype.element_ty), mask=mask)


def _row_contiguous(t: torch.Tensor) -> bool:
    """True when every row ``t[i]`` is one contiguous run (dims 1.. laid out densely; row stride free)."""
    expected = 1
    for size, stride in zip(reversed(t.shape[1:]), reversed(t.stride()[1:])):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _uncovered(cache: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor, keep: torch.Tensor | None) -> str | None:
    """Why the kernel does not cover these operands, or None when it does."""
    if not on_cuda(cache, slots, rows, keep):
        return f"operands on {cache.device} not covered"
    if not (cache.dtype in _FLOATS and rows.dtype in _FLOATS or cache.dtype in _INTS and rows.dtype in _INTS) \
            or slots.dtype not in _INTS:
        return f"rows {rows.dtype} -> cache {cache.dtype} (slots {slots.dtype}) not covered"
    if not _row_contiguous(cache):
        return "a cache whose rows are not contiguous runs is not covered"
    return None


def supports(cache: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor, keep: torch.Tensor | None = None) -> bool:
    """CUDA operands, float -> float or int -> int rows, int64 / int32 slots, a cache whose rows are contiguous."""
    return _uncovered(cache, slots, rows, keep) is None


def write_rows(cache: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor,
               keep: torch.Tensor | None = None) -> torch.Tensor:
    """``cache.write_rows``: ``cache[slots[i]] = rows[i].to(cache.dtype)`` where kept, in place; returns ``cache``.

    cache [N, *E]; slots [K] int64 (or int32); rows [K, *E]; keep [K] bool or None (= slots >= 0).
    One launch, no host sync (capturable in a CUDA graph)."""
    check_write_rows(cache, slots, rows, keep)
    why = _uncovered(cache, slots, rows, keep)
    if why is not None:
        return hand_off("cache.write_rows", why, write_rows_reference, cache, slots, rows, keep)
    return _launch(cache, slots, rows, keep)


def _launch(cache: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """The launch itself, for checked and covered operands (the CPU tests run it in Triton's interpreter)."""
    k = slots.shape[0]
    row_len = math.prod(cache.shape[1:])
    if k == 0 or cache.shape[0] == 0 or row_len == 0:
        return cache
    if not _row_contiguous(rows):
        rows = rows.contiguous()  # one extra copy; the models pass fresh (contiguous) rows
    # at least 16 columns: scalar rows (the Engram ids) then use 1/16 of the lanes, cheaper than risking
    # 1-wide blocks in the compiler; the column mask drops the rest
    block = min(max(next_pow2(row_len), 16), _MAX_BLOCK)
    per = min(64, _TILE // block)  # rows per program; a power of two
    grid = (triton.cdiv(k, per), triton.cdiv(row_len, block))
    keep_arg = keep.view(torch.uint8) if keep is not None else slots  # bool read as bytes; unused without keep
    _write_rows_kernel[grid](cache, slots, rows, keep_arg, k, cache.shape[0], row_len, cache.stride(0),
                             slots.stride(0), rows.stride(0), keep_arg.stride(0),
                             HAS_KEEP=keep is not None, ROWS=per, BLOCK=block, num_warps=4, **pdl_launch())
    return cache
