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


def _sliding_meta(spec: SlidingWindowSpec, slices: list[SeqSlice], gid: int) -> tuple[torch.Tensor, torch.Tensor]:
    bs, w = spec.block_size, spec.window
    writes, reads = [], []
    back = torch.arange(w - 1, -1, -1)
    for s in slices:
        table = torch.tensor(s.block_tables[gid], dtype=torch.long)
        p = torch.arange(s.start_pos, s.start_pos + s.num_tokens)
        w = table[p // bs] * bs + p % bs
        writes.append(torch.where(p < s.no_write_before, torch.full_like(w, -1), w))
        q = p[:, None] - back[None, :]  # positions max(0, p-W+1) .. p
        rows = table[q.clamp(min=0) // bs] * bs + q.clamp(min=0) % bs
        reads.append(torch.where(q >= 0, rows, torch.full_like(rows, -1)))
    return torch.cat(writes), torch.cat(reads)


def _compressed_meta(spec: CompressedSpec, slices: list[SeqSlice], gid: int) -> tuple[torch.Tensor, torch.Tensor]:
    r, epb, bs = spec.ratio, spec.entries_per_block, spec.block_size
    width = max(((s.start_pos + s.num_tokens) // r for s in slices), default=0)
    g = torch.arange(width)
    writes, reads = [], []
    for s in slices:
        table = torch.tensor(s.block_tables[gid] or [0], dtype=torch.long)
        p = torch.arange(s.start_pos, s.start_pos + s.num_tokens)
        own = table[((p // r) * r // bs).clamp(max=len(table) - 1)] * epb + (p // r) % epb
        writes.append(torch.where(((p + 1) % r == 0) & (p >= s.no_write_before), own, torch.full_like(own, -1)))
        gg = g[None, :].expand(len(p), -1)
        rows = table[(gg * r // bs).clamp(max=len(table) - 1)] * epb + gg % epb
        reads.append(torch.where(gg < ((p + 1) // r)[:, None], rows, torch.full_like(rows, -1)))
    return torch.cat(writes), torch.cat(reads)


def build_step_context(slices: list[SeqSlice], group_specs: dict[int, KVCacheSpec], cache_group: dict[str, int],
                       caches: dict[str, torch.Tensor], device: torch.device) -> StepContext:
    """Build the step's metadata (index math on the CPU, one copy per tensor to ``device``)."""
    positions: list[int] = []
    token_seq: list[int] = []
    for i, s in enumerate(slices):
        positions.extend(range(s.start_pos, s.start_pos + s.num_tokens))
        token_seq.extend([i] * s.num_tokens)
    groups: dict[int, GroupMetadata] = {}
    for gid, spec in group_specs.items():
        if isinstance(spec, SlidingWindowSpec):
            w, r = _sliding_meta(spec, slices, gid)
        elif isinstance(spec, CompressedSpec):
            w, r = _compressed_meta(spec, slices, gid)
        else:
            raise TypeError(f"group {gid} has non-paged spec {spec!r}")
        groups[gid] = GroupMetadata(spec, w.to(device), r.to(device))
    return StepContext(
        positions=torch.tensor(positions, dtype=torch.long).to(device),
        token_seq=torch.tensor(token_seq, dtype=torch.long).to(device),
        slices=slices, groups=groups, cache_group=cache_group, caches=caches,
        state_slots=torch.tensor([s.state_slot for s in slices], dtype=torch.long).to(device),
    )


def is_state(spec: KVCacheSpec) -> bool:
    return isinstance(spec, StateSpec)
