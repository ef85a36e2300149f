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

import array

from dataclasses import dataclass, field

import torch

from deepinfer_core.kernels.ops.kv import compressed_slots, sliding_slots
from deepinfer_core.kv.spec import CompressedSpec, KVCacheSpec, SlidingWindowSpec, StateSpec


@dataclass(frozen=True)
class SeqSlice:
    """One request's share of a step (CPU).

    ``start_pos``: tokens already in the cache; the step feeds positions
    ``start_pos .. start_pos + num_tokens - 1``. ``block_tables[g]`` covers every
    position the step writes or reads in group ``g`` (null/freed blocks may be any id
    for positions behind the window; they are never read). ``state_slot`` indexes
    per-request state tensors.

    Bounded prefix replay: ``window_floor`` > 0 means the request has no sliding-window KV below
    that position: sliding-window reads below it are dropped and its sliding-window writes are
    never suppressed (the replay rebuilds them; ``no_write_before`` then only protects the
    compressed groups). ``keep_all_rows``: a model that trims late layers to each request's last
    window of rows (V4.1 decoder-side replay) keeps every row of this one (prompt logprobs).
    """

    start_pos: int
    num_tokens: int
    block_tables: dict[int, list[int]]
    state_slot: int = 0
    no_write_before: int = 0  # prefix-cache hit: KV of positions below is shared and already written
    window_floor: int = 0
    keep_all_rows: bool = False


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
    # a decode step's layout: token i is slice i's only token. Its context then also carries ``extras``
    # ``token_slot [B]`` (the slices' state slots, contiguous) and ``seq_last_row [B]`` (= ``seq_first_row``), which
    # models may read instead of index math; a sub-context over some rows (a replay) leaves this False.
    one_token_each: bool = False

    def meta(self, cache_name: str) -> GroupMetadata:
        return self.groups[self.cache_group[cache_name]]


@dataclass
class _TokenIndex:
    """Per-token views of the slices (device): request index, position, the request's first
    position in this step, its no-write boundary and its sliding-window floor."""

    seq: torch.Tensor
    pos: torch.Tensor
    start: torch.Tensor
    no_write_before: torch.Tensor
    floor: torch.Tensor


def upload(host: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A host tensor on ``device`` without blocking the host: staged through pinned memory and copied
    asynchronously when ``device`` is not the tensor's own (an accelerator); returned as is otherwise.
    (A copy from pageable memory makes the host wait for the device.)"""
    dev = torch.device(device)
    if dev == host.device:
        return host
    return host.pin_memory().to(dev, non_blocking=True)


def _sliding_meta(spec: SlidingWindowSpec, tok: _TokenIndex, table: torch.Tensor, kernels: dict | None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    fn = kernels["kv.sliding_slots"] if kernels else sliding_slots
    return fn(table, tok.seq, tok.pos, tok.no_write_before, tok.floor, spec.block_size, spec.window)


def floor_window_reads(read_idx: torch.Tensor, positions: torch.Tensor, floor: torch.Tensor) -> torch.Tensor:
    """A sliding-window ``read_idx [T, W]`` (column j = position ``p - W + 1 + j``) with every column
    below ``floor [T]`` (int64, per token) set to -1: positions whose window KV does not exist."""
    w = read_idx.shape[1]
    q = positions[:, None] - torch.arange(w - 1, -1, -1, device=positions.device)[None, :]
    return torch.where(q >= floor[:, None], read_idx, torch.full_like(read_idx, -1))


def _compressed_meta(spec: CompressedSpec, tok: _TokenIndex, table: torch.Tensor, width: int, kernels: dict | None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    fn = kernels["kv.compressed_slots"] if kernels else compressed_slots
    return fn(table, tok.seq, tok.pos, tok.no_write_before, spec.ratio, spec.entries_per_block, spec.block_size,
              width)


_ROW = 6  # packed ints per request: start, no_write_before, state_slot, num_tokens, window_floor, keep_all_rows


@dataclass(frozen=True)
class StepLayout:
    """Shapes of a packed step (host ints; hashable, so it can key a captured graph).

    ``table_widths``: (gid, block-table width) per paged group; ``read_widths``: (gid, entries read per
    token) per compressed group; ``has_ids``: the packed tensor starts with the step's input ids;
    ``one_token_each``: every request brings exactly one token (a decode step: token i is request i)."""

    num_seqs: int
    num_tokens: int
    has_ids: bool
    table_widths: tuple[tuple[int, int], ...]
    read_widths: tuple[tuple[int, int], ...]
    one_token_each: bool = False


class TableRowCache:
    """The packed bytes of block-table rows, reused while a row is unchanged (host time of a step).

    A decode step's tables barely change from one step to the next (a new block every ``block_size``
    tokens, a freed one behind the window), yet converting the ~20-30k Python ints of a 64-request
    step to int64 costs ~0.6 ms on its own (thirteenth pass, docs/performance.md). Each entry is
    keyed by (group, state slot) and holds the width and a copy of the row it was made from; a
    lookup compares the row with that copy (a C-level list comparison), so a changed row is always
    re-packed: the cache can never return stale bytes. One entry per (group, slot): the size is
    bounded by groups x (max_num_seqs + 1)."""

    def __init__(self) -> None:
        self._rows: dict[tuple[int, int], tuple[int, list[int], bytes]] = {}
        # per group: (width, slots, the rows' cached copies, the joined bytes) of the last step
        self._groups: dict[int, tuple[int, list[int], list[list[int]], bytes]] = {}

    def __len__(self) -> int:
        return len(self._rows)

    def group_bytes(self, gid: int, slots: list[int], rows: list[list[int]], width: int) -> bytes:
        """All of a group's rows (``rows[i]`` of request slot ``slots[i]``) packed at ``width``, joined. When
        the slots and every row equal the last step's (one C-level comparison of the lists, the common
        decode step) the last step's bytes are returned without a Python call per row."""
        hit = self._groups.get(gid)
        if hit is not None and hit[0] == width and hit[1] == slots and hit[2] == rows:
            return hit[3]
        packed = b"".join([self.row_bytes(gid, slot, row, width) for slot, row in zip(slots, rows)])
        self._groups[gid] = (width, list(slots), [self._rows[(gid, slot)][1] for slot in slots], packed)
        return packed

    def row_bytes(self, gid: int, slot: int, row: list[int], width: int) -> bytes:
        """``row`` cut or padded with the null block 0 to ``width`` ints, as native int64 bytes."""
        hit = self._rows.get((gid, slot))
        if hit is not None and hit[0] == width and hit[1] == row:
            return hit[2]
        cut = row[:width]
        packed = array.array("q", cut).tobytes() + bytes(8 * (width - len(cut)))
        self._rows[(gid, slot)] = (width, list(row), packed)
        return packed


def pack_step(slices: list[SeqSlice], group_specs: dict[int, KVCacheSpec], input_ids: list[int] | None = None,
              table_widths: dict[int, int] | None = None, read_widths: dict[int, int] | None = None,
              row_cache: TableRowCache | None = None) -> tuple[torch.Tensor, StepLayout]:
    """Everything the device needs to build a step's metadata, as one flat int64 host tensor:
    [input ids (optional)] + per-request rows (start, no_write_before, state_slot, num_tokens, window_floor,
    keep_all_rows) + every
    group's block tables, row-major. ``table_widths`` / ``read_widths`` fix the widths (a captured graph
    needs them static; longer tables are cut, shorter ones padded with the null block 0); by default they
    are the step's own maxima. ``row_cache``: reuse the packed bytes of unchanged table rows (the result
    is the same with or without it)."""
    flat: list[int] = list(input_ids) if input_ids is not None else []
    flat += [v for s in slices for v in (s.start_pos, s.no_write_before, s.state_slot, s.num_tokens, s.window_floor,
                                         int(s.keep_all_rows))] or [0] * _ROW
    parts: list[bytes] = []
    slots = [s.state_slot for s in slices]
    tw: list[tuple[int, int]] = []
    rw: list[tuple[int, int]] = []
    for gid, spec in group_specs.items():
        width = (table_widths or {}).get(gid) or max((len(s.block_tables[gid]) for s in slices), default=0) or 1
        if row_cache is not None:
            parts.append(row_cache.group_bytes(gid, slots, [s.block_tables[gid] for s in slices], width))
        else:
            tables: list[int] = []
            for s in slices:
                row = s.block_tables[gid][:width]
                tables += row
                tables += [0] * (width - len(row))
            parts.append(array.array("q", tables).tobytes())
        tw.append((gid, width))
        if isinstance(spec, CompressedSpec):
            n = (read_widths or {}).get(gid)
            rw.append((gid, n if n is not None else max(((s.start_pos + s.num_tokens) // spec.ratio for s in slices),
                                                        default=0)))
    total = sum(s.num_tokens for s in slices)
    layout = StepLayout(len(slices), total, input_ids is not None, tuple(tw), tuple(rw),
                        bool(slices) and all(s.num_tokens == 1 for s in slices))
    # array('q') bytes + frombuffer: ~3x faster than torch.tensor(list) (twelfth pass); the table rows come
    # from row_cache when it is given (thirteenth pass)
    buf = bytearray().join([array.array("q", flat).tobytes(), *parts])
    return torch.frombuffer(buf, dtype=torch.long), layout


def context_from_packed(dev: torch.Tensor, layout: StepLayout, group_specs: dict[int, KVCacheSpec],
                        cache_group: dict[str, int], caches: dict[str, torch.Tensor], slices: list[SeqSlice],
                        kernels: dict | None = None) -> tuple[torch.Tensor | None, StepContext]:
    """(input ids [T] or None, the StepContext) from ``pack_step``'s tensor already on the device: index
    math only, shapes from ``layout`` alone (no host synchronisation, capturable in a graph).

    ``kernels``: resolved ``kv.sliding_slots`` / ``kv.compressed_slots`` (the platform's, e.g. one Triton
    launch per group); None runs their references."""
    device = dev.device
    b, total = layout.num_seqs, layout.num_tokens
    ids = dev[:total] if layout.has_ids else None
    off = total if layout.has_ids else 0
    info = dev[off:off + max(b, 1) * _ROW].view(-1, _ROW)
    off += max(b, 1) * _ROW
    counts_d = info[:b, 3]
    if layout.one_token_each:
        # decode: token i is request i at its start position. Two launches (an arange, one copy of the info
        # columns) instead of the ~13 of the general path (repeat_interleave, cumsum, gathers), once a step.
        seq = first_row = torch.arange(b, device=device)
        cols = info[:b, :5].t().contiguous()  # [5, B]: start, no_write_before, state_slot, num_tokens, floor
        pos = cols[0]
        tok = _TokenIndex(seq, pos, pos, cols[1], cols[4])
    else:
        # output_size: the token count is known on the host, so the device need not report it
        seq = torch.repeat_interleave(torch.arange(b, device=device), counts_d, output_size=total)
        first_row = torch.cumsum(counts_d, 0) - counts_d
        pos = info[seq, 0] + torch.arange(total, device=device) - first_row[seq]
        tok = _TokenIndex(seq, pos, info[seq, 0], info[seq, 1], info[seq, 4])
    read_widths = dict(layout.read_widths)
    groups: dict[int, GroupMetadata] = {}
    tables: dict[int, torch.Tensor] = {}
    for gid, width in layout.table_widths:
        spec = group_specs[gid]
        table = tables[gid] = dev[off:off + b * width].view(b, width)
        off += b * width
        if isinstance(spec, SlidingWindowSpec):
            w, r = _sliding_meta(spec, tok, table, kernels)
        elif isinstance(spec, CompressedSpec):
            w, r = _compressed_meta(spec, tok, table, read_widths[gid], kernels)
        else:
            raise TypeError(f"group {gid} has non-paged spec {spec!r}")
        groups[gid] = GroupMetadata(spec, w, r)
    ctx = StepContext(positions=pos, token_seq=seq, slices=slices, groups=groups, cache_group=cache_group,
                      caches=caches, state_slots=info[:b, 2], one_token_each=layout.one_token_each)
    ctx.extras["seq_start"] = info[:b, 0]  # [B] first position of each slice
    ctx.extras["tables"] = tables  # {gid: [B, width] int64} block tables (0 padded)
    ctx.extras["token_start"] = tok.start
    ctx.extras["seq_first_row"] = first_row
    ctx.extras["seq_end"] = info[:b, 0] + counts_d
    ctx.extras["window_floor"] = info[:b, 4]
    if layout.one_token_each:  # a slice is its one token: its state slot and last row need no index math
        ctx.extras["token_slot"] = cols[2]  # [B] contiguous
        ctx.extras["seq_last_row"] = first_row
    return ids, ctx


def build_step_context(slices: list[SeqSlice], group_specs: dict[int, KVCacheSpec], cache_group: dict[str, int],
                       caches: dict[str, torch.Tensor], device: torch.device, kernels: dict | None = None,
                       row_cache: TableRowCache | None = None) -> StepContext:
    """Build the step's metadata: one small host-to-device copy (asynchronous, from pinned memory, on an
    accelerator), then index math on ``device`` for all requests at once (no per-token or per-request
    Python loops, and no host synchronisation)."""
    host, layout = pack_step(slices, group_specs, row_cache=row_cache)
    return context_from_packed(upload(host, device), layout, group_specs, cache_group, caches, slices, kernels)[1]


def is_state(spec: KVCacheSpec) -> bool:
    return isinstance(spec, StateSpec)
