"""Decoder-side SWA bounded replay of DeepSeek-V4.1 (MODEL_SPEC.md 6.2; vLLM
``models/deepseek_v41/decoder_replay_layers.py``, SGLang ``--enable-decoder-swa-bounded-replay``).

Layers after the last kv-source layer ``c`` own only sliding-window KV: no later layer reads
anything they compute for a row other than their window KV and the row's own output. So in a
prefill step, once layer ``c`` has written every row's KV (SWA, compressed entries, index
keys), layer ``c``'s attention and everything after it run only on each request's last
``min(n, W)`` rows (all rows of a request that wants prompt logprobs). The kept rows' windows:

- at layer ``c``: unchanged (its SWA KV exists for every row), i.e. floored at the request's
  encoder-side replay start only;
- at layers after ``c``: also floored at ``seq_end - W`` for a trimmed request, because the
  window KV of its trimmed rows does not exist there.

The last row of every request (the one that samples) sees a full window at every layer, but the
rows it reads at layers ``> c + 1`` were computed from truncated windows: the result is close to,
not equal to, a full prefill ("not numerically equivalent", both references). Decode steps
(one row per request) and captured graphs (``ctx.slices`` empty) never trim.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from deepinfer_core.kv.spec import SlidingWindowSpec
from deepinfer_core.runner.context import GroupMetadata, StepContext, floor_window_reads, upload
from deepinfer_models.deepseek_v41.config import DeepseekV41Config


def replay_cut(cfg: DeepseekV41Config) -> int | None:
    """The cut layer ``c = max(kv_source_layer_ids)`` when decoder-side replay applies, else None.

    vLLM's conditions that concern one process: a layer after ``c`` exists, ``c`` has ratio <= 1
    (a ratio-2 ring would straddle trimmed rows) and no Engram layer sits at or after ``c``
    (its token history would need every row)."""
    if not cfg.kv_source_layer_ids:
        return None
    c = max(cfg.kv_source_layer_ids)
    if c >= cfg.num_hidden_layers - 1 or cfg.ratio(c) > 1:
        return None
    if any(e >= c for e in cfg.engram_layer_ids):
        return None
    return c


@dataclass
class ReplayPlan:
    """One step's kept rows (int64 [K] on the step's device, ascending) and the contexts of the
    kept rows: ``cut_ctx`` for layer c's attention, ``late_ctx`` for the layers after it."""

    rows: torch.Tensor
    cut_ctx: StepContext
    late_ctx: StepContext
    num_rows: int
    num_kept: int


def plan_replay(ctx: StepContext, window: int) -> ReplayPlan | None:
    """The step's replay plan, or None when no request has more than ``window`` rows to trim.

    Host ints only (from ``ctx.slices``) plus one small upload; no device synchronisation."""
    if not ctx.slices or ctx.extras.get("static_shapes"):
        return None
    rows: list[torch.Tensor] = []
    firsts: list[int] = []
    trimmed: list[bool] = []
    first = kept = 0
    for s in ctx.slices:
        k = s.num_tokens if s.keep_all_rows else min(s.num_tokens, window)
        rows.append(torch.arange(first + s.num_tokens - k, first + s.num_tokens))
        firsts.append(kept)
        trimmed.append(k < s.num_tokens)
        first += s.num_tokens
        kept += k
    if not any(trimmed):
        return None
    device = ctx.positions.device
    host = torch.cat(rows + [torch.tensor(firsts), torch.tensor(trimmed, dtype=torch.long)])
    dev = upload(host, device)
    b = len(ctx.slices)
    kept_rows, first_rows, trim = dev[:kept], dev[kept:kept + b], dev[kept + b:] > 0
    pos = ctx.positions.index_select(0, kept_rows)
    seq = ctx.token_seq.index_select(0, kept_rows)
    cut = _sub_context(ctx, kept_rows, pos, seq, first_rows, None)
    # trimmed requests have no window KV below seq_end - W at the layers after c
    late_floor = torch.where(trim[seq], ctx.extras["seq_end"][seq] - window, torch.zeros_like(pos))
    late = _sub_context(ctx, kept_rows, pos, seq, first_rows, late_floor)
    return ReplayPlan(kept_rows, cut, late, first, kept)


def _sub_context(ctx: StepContext, rows: torch.Tensor, pos: torch.Tensor, seq: torch.Tensor,
                 first_rows: torch.Tensor, window_floor: torch.Tensor | None) -> StepContext:
    """``ctx`` restricted to ``rows``; sliding-window reads floored at ``window_floor [K]`` if given."""
    groups = {}
    for gid, m in ctx.groups.items():
        read = m.read_idx.index_select(0, rows)
        if window_floor is not None and isinstance(m.spec, SlidingWindowSpec):
            read = floor_window_reads(read, pos, window_floor)
        groups[gid] = GroupMetadata(m.spec, m.write_slots.index_select(0, rows), read)
    sub = StepContext(positions=pos, token_seq=seq, slices=ctx.slices, groups=groups, cache_group=ctx.cache_group,
                      caches=ctx.caches, state_slots=ctx.state_slots, extras=dict(ctx.extras))
    # ``one_token_each`` stays False: a subset of a decode step's rows is not read through its per-row shortcuts
    sub.extras["token_start"] = ctx.extras["token_start"].index_select(0, rows)
    sub.extras["seq_first_row"] = first_rows
    return sub
