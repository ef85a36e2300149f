"""Per-step attention metadata over paged KV-cache groups, built once per step.

The runner describes each scheduled request by a ``SeqSlice`` (CPU ints); this
module turns the slices into device index tensors shared by every layer of a
group, so layers never touch block tables themselves:

- sliding-window group: ``write_slots [T]`` (flat cache row of each token's
  entry) and ``read_idx [T, W]`` (rows of positions ``max(0, p-W+1) .. p``);
- compressed group of ratio r: ``write_slots [T]`` (row of entry ``p // r`` for a
  token that closes a window, i.e. ``(p+1) % r == 0``, else -1) and ``read_idx
  [T, N]`` (rows of the visible entries ``0 .. (p+1)//r - 1`` in entry order).

A flat cache of a group is ``[num_blocks * entries_per_block, *entry_shape]``;
block id ``b`` owns rows ``[b*E, (b+1)*E)``. -1 always means "no entry".
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from deepinfer_core.kv.spec import CompressedSpec, KVCacheSpec, SlidingWindowSpec, StateSpec


@dataclass(frozen=True)
class SeqSlice:
    """One request's share of a step (CPU).

    ``start_pos``: tokens already in the cache; the step feeds positions
    ``start_pos .. start_pos + num_tokens - 1``. ``block_tables[g]`` covers every
    position the step writes or reads in group ``g`` (null/freed blocks may be any id
    for positions behind the window; they are never read). ``state_slot`` indexes
    per-request state tensors.
    """

    start_pos: int
    num_tokens: int
    block_tables: dict[int, list[int]]
    state_slot: int = 0
    no_write_before: int = 0  # prefix-cache hit: KV of positions below is shared and already written


@dataclass
class GroupMetadata:
    """Device index tensors of one paged group for one step."""

    spec: KVCacheSpec
    write_slots: torch.Tensor  # [T] int64
    read_idx: torch.Tensor  # [T, N] int64, -1 padded


@dataclass
class StepContext:
    """Everything a model forward needs besides input ids (built once per step).

    positions [T] int64 (device); ``token_seq [T]`` request index of each token;
    ``slices`` the CPU slices; ``groups[g]`` metadata per paged group; ``cache_group``
    maps a cache name to its group id (paged) and ``caches`` holds the flat tensors
    (paged and state). ``state_slots [B]`` device tensor of the slices' state slots.
    """

    positions: torch.Tensor
    token_seq: torch.Tensor
    slices: list[SeqSlice]
    groups: dict[int, GroupMetadata]
    cache_group: dict[str, int]
    caches: dict[str, torch.Tensor]
    state_slots: torch.Tensor
    extras: dict = field(default_factory=dict)

    def meta(self, cache_name: str) -> GroupMetadata:
        return self.groups[self.cache_group[cache_name]]


@dataclass
class _TokenIndex:
    """Per-token views of the slices (device): request index, position, the request's first
    position in this step and its no-write boundary."""

    seq: torch.Tensor
    pos: torch.Tensor
    start: torch.Tensor
    no_write_before: torch.Tensor


def upload(host: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A host tensor on ``device`` without blocking the host: staged through pinned memory and copied
    asynchronously when ``device`` is not the tensor's own (an accelerator); returned as is otherwise.
    (A copy from pageable memory makes the host wait for the device.)"""
    dev = torch.device(device)
    if dev == host.device:
        return host
    return host.pin_memory().to(dev, non_blocking=True)


def _padded_rows(slices: list[SeqSlice], gid: int) -> tuple[int, list[int]]:
    """Block tables of group ``gid`` as [B, width] (row-major, 0 padded), flat; and the width."""
    width = max((len(s.block_tables[gid]) for s in slices), default=0) or 1
    flat: list[int] = []
    for s in slices:
        flat += s.block_tables[gid]
        flat += [0] * (width - len(s.block_tables[gid]))
    return width, flat


def _sliding_meta(spec: SlidingWindowSpec, tok: _TokenIndex, table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    bs, w = spec.block_size, spec.window
    p = tok.pos
    own = table[tok.seq, p // bs] * bs + p % bs
    writes = torch.where(p < tok.no_write_before, torch.full_like(own, -1), own)
    q = p[:, None] - torch.arange(w - 1, -1, -1, device=p.device)[None, :]  # positions p-W+1 .. p
    qc = q.clamp(min=0)
    rows = table[tok.seq[:, None], qc // bs] * bs + qc % bs
    return writes, torch.where(q >= 0, rows, torch.full_like(rows, -1))


def _compressed_meta(spec: CompressedSpec, tok: _TokenIndex, table: torch.Tensor, width: int
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    r, epb, bs = spec.ratio, spec.entries_per_block, spec.block_size
    p = tok.pos
    last = table.shape[1] - 1
    own = table[tok.seq, ((p // r) * r // bs).clamp(max=last)] * epb + (p // r) % epb
    writes = torch.where(((p + 1) % r == 0) & (p >= tok.no_write_before), own, torch.full_like(own, -1))
    g = torch.arange(width, device=p.device)[None, :]
    rows = table[tok.seq[:, None], (g * r // bs).clamp(max=last)] * epb + g % epb
    return writes, torch.where(g < ((p + 1) // r)[:, None], rows, torch.full_like(rows, -1))


def build_step_context(slices: list[SeqSlice], group_specs: dict[int, KVCacheSpec], cache_group: dict[str, int],
                       caches: dict[str, torch.Tensor], device: torch.device) -> StepContext:
    """Build the step's metadata: one small host-to-device copy (asynchronous, from pinned memory, on an
    accelerator), then index math on ``device`` for all requests at once (no per-token or per-request
    Python loops, and no host synchronisation)."""
    # one host-to-device copy for the whole step: per-request info rows, then every group's table
    b = len(slices)
    total = sum(s.num_tokens for s in slices)
    flat = [v for s in slices for v in (s.start_pos, s.no_write_before, s.state_slot, s.num_tokens)] or [0, 0, 0, 0]
    widths: dict[int, int] = {}
    for gid in group_specs:
        widths[gid], rows = _padded_rows(slices, gid)
        flat += rows
    host = torch.tensor(flat, dtype=torch.long)
    dev = upload(host, device)
    info = dev[:max(b, 1) * 4].view(-1, 4)
    counts_d = info[:b, 3]
    # output_size: the token count is known on the host, so the device need not report it
    seq = torch.repeat_interleave(torch.arange(b, device=device), counts_d, output_size=total)
    first_row = torch.cumsum(counts_d, 0) - counts_d
    pos = info[seq, 0] + torch.arange(total, device=device) - first_row[seq]
    tok = _TokenIndex(seq, pos, info[seq, 0], info[seq, 1])
    groups: dict[int, GroupMetadata] = {}
    off = max(b, 1) * 4
    for gid, spec in group_specs.items():
        table = dev[off:off + b * widths[gid]].view(b, widths[gid])
        off += b * widths[gid]
        if isinstance(spec, SlidingWindowSpec):
            w, r = _sliding_meta(spec, tok, table)
        elif isinstance(spec, CompressedSpec):
            width = max(((s.start_pos + s.num_tokens) // spec.ratio for s in slices), default=0)
            w, r = _compressed_meta(spec, tok, table, width)
        else:
            raise TypeError(f"group {gid} has non-paged spec {spec!r}")
        groups[gid] = GroupMetadata(spec, w, r)
    ctx = StepContext(positions=pos, token_seq=seq, slices=slices, groups=groups, cache_group=cache_group,
                      caches=caches, state_slots=info[:len(slices), 2])
    ctx.extras["token_start"] = tok.start
    ctx.extras["seq_first_row"] = first_row
    ctx.extras["seq_end"] = info[:len(slices), 0] + counts_d
    return ctx


def is_state(spec: KVCacheSpec) -> bool:
    return isinstance(spec, StateSpec)
