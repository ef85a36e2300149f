"""Index helpers with data-independent shapes (no host synchronisation).

Boolean-mask indexing (``cache[w[keep]] = rows[keep]``), ``nonzero`` and ``if t.numel()`` on a
data-dependent result all make the host wait for the device, which blocks capturing a whole
step in one CUDA graph. These helpers do the same work with shapes known from the inputs'
shapes alone, and give results bit-identical to the masked forms:

- ``write_rows``: ``cache[slots[i]] = rows[i]`` for the kept rows, through the registered kernel op
  ``cache.write_rows`` (reference: ``deepinfer_core/kernels/ops/cache.py``, which redirects every row
  not kept to repeat the write of the first kept row; a platform kernel does it in one launch).
- ``compact``: the first ``size`` indices of a 1-D mask's True entries (a static-size ``nonzero``),
  with a validity mask for the padding.
- ``take_rows``: ``v[rows]``, or ``v`` itself when every row is selected (``rows`` None), so a decode step
  that keeps every row launches no gather.
- ``closes_any``: whether a step closes any compressor window, read from the host-side slices (no
  sync), so an eager step can skip the pooling; a step captured in a graph sets
  ``ctx.extras["static_shapes"] = True`` and always runs it.
"""
from __future__ import annotations

from typing import Callable, Mapping

import torch

from deepinfer_core.kernels.ops.cache import write_rows as _write_rows_reference

# The ``cache.write_rows`` callable ``write_rows`` runs (see ``use_kernels``).
_write_rows_op: Callable[..., torch.Tensor] = _write_rows_reference


def use_kernels(kernels: Mapping[str, Callable]) -> None:
    """Route ``write_rows`` to the resolved ``cache.write_rows`` of ``kernels`` (a model's table).

    Called once at model load (``DeepseekCausalLMBase._setup``), so the op follows the model's
    platform, overrides and kernel mode like every other op. One process-wide choice: the last
    model loaded wins, which is safe because every provider writes the same bits (a copy) and a
    platform kernel hands operands it does not cover (host tensors) to the reference. Until a model
    binds one, the reference runs."""
    global _write_rows_op
    _write_rows_op = kernels.get("cache.write_rows", _write_rows_op)


def write_rows(cache: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor, keep: torch.Tensor | None = None) -> None:
    """``cache[slots[i]] = rows[i].to(cache.dtype)`` for each i with ``keep[i]`` (default ``slots >= 0``).

    cache [N, *E]; slots [K] int64; rows [K, *E]. The kept slots must be distinct (as for the
    masked form, whose result would otherwise depend on the write order). No host sync."""
    _write_rows_op(cache, slots, rows, keep)


def take_rows(v: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """``v[rows]``, or ``v`` itself for every row (None): a decode step's selection, without an index launch."""
    return v if rows is None else v[rows]


def compact(mask: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """1-D bool mask [T] -> (idx [size] int64, valid [size] bool): the positions of the first ``size``
    True entries in order (``mask.nonzero()[:size]``), padded with 0 where ``valid`` is False."""
    t = mask.shape[0]
    dev = mask.device
    if size == 0 or t == 0:
        return torch.zeros(size, dtype=torch.long, device=dev), torch.zeros(size, dtype=torch.bool, device=dev)
    rank = torch.cumsum(mask.to(torch.long), 0) - 1  # output slot of each True entry
    tgt = torch.where(mask & (rank < size), rank, torch.full_like(rank, size))  # the rest -> scratch slot `size`
    out = torch.zeros(size + 1, dtype=torch.long, device=dev)
    out.scatter_(0, tgt, torch.arange(t, device=dev))
    valid = torch.arange(size, device=dev) < rank[-1] + 1
    return out[:size], valid


def closes_any(ctx, ratio: int) -> bool:
    """Whether a token of the step closes a window of ``ratio`` (position p with (p+1) % ratio == 0).

    Host-side, from ``ctx.slices`` (a slice feeds positions start .. start+n-1), cached per step in
    ``ctx.extras``; always True when ``ctx.extras["static_shapes"]`` is set (graph capture)."""
    if ctx.extras.get("static_shapes") or not ctx.slices:
        return True
    key = ("closes_any", ratio)
    hit = ctx.extras.get(key)
    if hit is None:
        hit = ctx.extras[key] = any((s.start_pos + s.num_tokens) // ratio > s.start_pos // ratio for s in ctx.slices)
    return hit
