"""KVCacheManager: per-request block tables for every paged KV group, plus state slots.

Pure Python over ints (STYLE.md habit 11). The manager decides *which* block
ids hold a request's KV; the model runner owns the pages (one page per block id
per layer of each group, see ``block_pool.py``) and reads the tables it is given
in each ``SchedulerOutput``.

Groups (ARCHITECTURE.md section 4). Each distinct paged spec is one group with
its own block size in tokens and its own table per request:

- table entry ``i`` of a group with block size ``B`` holds the request's tokens
  ``[i*B, (i+1)*B)`` (for a compressed group: the entries those tokens produce).
  Tables are position-indexed and never shift; freed entries become the null block.
- ``SlidingWindowSpec`` (window ``W``): a query at position ``p`` reads tokens
  ``[p-W+1, p]``. Once the request has *processed* ``P`` tokens (computed and no
  longer in flight), no future query reads a token below ``P-W+1``, so every
  block lying wholly below it is returned to the pool and its entry set to null.
  Freeing is driven by processed tokens, never by tokens merely scheduled, so an
  in-flight step (async scheduling) or a future rollback never loses a block it reads.
- ``CompressedSpec``: grows by one block per ``block_size`` tokens; never freed
  before the request ends.

State (``StateSpec``): one slot per running request out of ``max_num_seqs`` slots,
taken on the request's first allocation and returned by ``free``. The slot index
addresses every state tensor; a request whose ``num_computed_tokens`` is 0 in a
step starts from a fresh (to be initialised) slot.

Requests are duck-typed: the manager reads ``request_id``, ``num_computed_tokens``
(tokens whose KV is written or being written) and ``num_processed_tokens``
(``num_computed_tokens`` minus tokens still in flight). ``deepinfer_core.request.Request``
provides them.

Prefix caching (``enable_caching``): every full block whose tokens are processed
gets a chained hash of (group, previous block's hash, its token ids) and stays
findable after it is freed (LRU, ``block_pool.py``). Sliding-window blocks are
cached too: a hit at ``h`` tokens reuses every compressed block below ``h`` and
the sliding blocks that cover the last window before the replayed tokens, so the
restored state is exactly what a cold prefill computes. Only ``replay_tokens``
tokens before ``h`` (the model's compressor overlap span; at least one when
``h`` is the whole known sequence, so that logits exist) are recomputed, to rebuild
the per-request compressor state; their cache writes are suppressed. Resume
after preemption takes the same path. See docs/prefix_caching.md.

Bounded replay (``replay_mode="bounded"``, vLLM/SGLang's SWA bounded replay): sliding-window
groups are not cached at all (their blocks are freed without a hash and reused before any
cached block). A hit at ``h`` reuses the compressed blocks below ``h`` and recomputes the last
``w = min(window, h)`` tokens (plus ``history_tokens`` before them, the ids a per-request
token history needs) with every sliding window floored at ``h - w`` (``PrefixTables.window_floor``):
the rebuilt window KV is approximate, not bit-identical to a cold prefill.

Host tier (``host_tier``, optional, see ``host_tier.py``): a cached block the pool evicts is
spilled to host memory under ``(group, hash)``; ``find_prefix`` counts a hash found only there
as a hit and ``allocate_prefix`` takes a fresh block for it and records the copy back. The
manager only records copies (``take_host_copies``); the engine applies them before the step.
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Protocol

from deepinfer_core.kv.block_pool import NULL_BLOCK_ID, BlockPool
from deepinfer_core.kv.host_tier import HostCopy, HostTier
from deepinfer_core.kv.spec import CompressedSpec, PagedSpec, SlidingWindowSpec, StateSpec


class KVRequest(Protocol):
    request_id: str
    num_computed_tokens: int

    @property
    def num_processed_tokens(self) -> int: ...


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _check_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")


def bytes_per_block_id(group_specs: Sequence[PagedSpec], layers_per_group: Mapping[int, int]) -> int:
    """Device bytes one block id costs: sum over groups of ``page_bytes * layers in the group``."""
    if set(layers_per_group) != set(range(len(group_specs))):
        raise ValueError(
            f"layers_per_group must have exactly the keys 0..{len(group_specs) - 1} (one per group), "
            f"got {sorted(layers_per_group)}"
        )
    total = 0
    for g, spec in enumerate(group_specs):
        _check_positive_int(f"layers_per_group[{g}]", layers_per_group[g])
        total += spec.page_bytes * layers_per_group[g]
    return total


def num_blocks_from_memory_budget(
    group_specs: Sequence[PagedSpec], layers_per_group: Mapping[int, int], budget_bytes: int
) -> int:
    """How many block ids (null block included) fit in ``budget_bytes`` of paged KV memory.

    State slots are not paged; reserve their memory (``slot_bytes * layers *
    max_num_seqs``) before calling this.
    """
    per_id = bytes_per_block_id(group_specs, layers_per_group)
    if per_id <= 0:
        raise ValueError("paged groups need a positive page size to size the pool")
    num_blocks = budget_bytes // per_id
    if num_blocks < 2:
        raise ValueError(
            f"KV budget of {budget_bytes} bytes holds {num_blocks} block ids of {per_id} bytes each; "
            "need at least 2 (the null block and one usable block)"
        )
    return num_blocks


class PrefixTables(dict):
    """``find_prefix``'s tables (group -> block ids) plus ``restores``: ``(group, index, hash)`` of
    entries found only on the host tier (their table entry is a null placeholder until
    ``allocate_prefix`` gives them a device block), and ``window_floor``: in bounded-replay mode
    the position below which the request has no sliding-window KV (0 in exact mode)."""

    def __init__(self, tables: dict[int, list[int]], restores: list[tuple[int, int, int]],
                 window_floor: int = 0) -> None:
        super().__init__(tables)
        self.restores = restores
        self.window_floor = window_floor


class _RequestBlocks:
    """One request's tables (one per group), the first live index of each, and its state slot."""

    __slots__ = ("tables", "first_live", "state_slot", "num_hashed", "hashes")

    def __init__(self, num_groups: int, state_slot: int) -> None:
        self.tables: list[list[int]] = [[] for _ in range(num_groups)]
        # Entries below first_live[g] are null (freed behind the window).
        self.first_live: list[int] = [0] * num_groups
        # Leading entries already carrying their prefix-cache hash, per group.
        self.num_hashed: list[int] = [0] * num_groups
        self.hashes: list[list[int]] = [[] for _ in range(num_groups)]
        self.state_slot = state_slot


class KVCacheManager:
    """Block tables for each paged group and state slots, over one shared ``BlockPool``.

    ``group_specs[g]`` is paged group ``g`` (distinct specs; layers with equal
    specs share one group). ``state_specs`` only document which state exists:
    all of them are addressed by the same per-request slot.
    """

    def __init__(
        self,
        group_specs: Sequence[PagedSpec],
        state_specs: Sequence[StateSpec],
        num_blocks: int,
        max_num_seqs: int,
        enable_caching: bool = False,
        replay_tokens: int = 0,
        host_tier: HostTier | None = None,
        replay_mode: str = "exact",
        history_tokens: int = 0,
        replay_window: int | None = None,
    ) -> None:
        for g, spec in enumerate(group_specs):
            if not isinstance(spec, (SlidingWindowSpec, CompressedSpec)):
                raise TypeError(f"group_specs[{g}] must be a SlidingWindowSpec or CompressedSpec, got {type(spec).__name__}")
            _check_positive_int(f"group_specs[{g}].block_size", spec.block_size)
            if isinstance(spec, SlidingWindowSpec):
                _check_positive_int(f"group_specs[{g}].window", spec.window)
        if len(set(group_specs)) != len(group_specs):
            raise ValueError("group_specs contains equal specs; layers with equal specs must share one group")
        for i, spec in enumerate(state_specs):
            if not isinstance(spec, StateSpec):
                raise TypeError(f"state_specs[{i}] must be a StateSpec, got {type(spec).__name__}")
        _check_positive_int("max_num_seqs", max_num_seqs)
        if replay_mode not in ("exact", "bounded"):
            raise ValueError(f"replay_mode must be 'exact' or 'bounded', got {replay_mode!r}")
        self.group_specs: tuple[PagedSpec, ...] = tuple(group_specs)
        self.state_specs: tuple[StateSpec, ...] = tuple(state_specs)
        self.max_num_seqs = max_num_seqs
        self.pool = BlockPool(num_blocks)
        self._reqs: dict[str, _RequestBlocks] = {}
        self._free_slots: deque[int] = deque(range(max_num_seqs))
        self.enable_caching = enable_caching
        self.replay_tokens = replay_tokens
        # bounded replay: sliding-window groups are never cached (their KV is rebuilt on a hit)
        self.bounded = replay_mode == "bounded"
        self.history_tokens = history_tokens
        self.cached_groups = tuple(g for g, spec in enumerate(self.group_specs)
                                   if not (self.bounded and isinstance(spec, SlidingWindowSpec)))
        # bounded: tokens a hit rebuilds with floored windows (default: the widest sliding window, as the
        # references; longer replays are closer to exact, docs/prefix_caching.md)
        self.replay_window = replay_window or max(
            (s.window for s in self.group_specs if isinstance(s, SlidingWindowSpec)), default=0)
        self.pool.reuse_uncached_first = self.bounded and enable_caching
        cached = [self.group_specs[g].block_size for g in self.cached_groups]
        self.align = math.lcm(*cached) if cached else 1
        self.num_query_tokens = 0  # prefix-cache metrics: tokens looked up ...
        self.num_hit_tokens = 0  # ... and tokens not recomputed thanks to a hit
        self.host = host_tier if enable_caching else None
        if self.host is not None:
            # Group of each hashed block: the pool is shared by all groups, the host key is (group, hash).
            self._block_group = [-1] * num_blocks
            self.pool.on_evict = self._spill

    @classmethod
    def from_memory_budget(
        cls,
        group_specs: Sequence[PagedSpec],
        state_specs: Sequence[StateSpec],
        layers_per_group: Mapping[int, int],
        budget_bytes: int,
        max_num_seqs: int,
    ) -> KVCacheManager:
        """Build a manager whose pool fills ``budget_bytes`` (see ``num_blocks_from_memory_budget``)."""
        num_blocks = num_blocks_from_memory_budget(group_specs, layers_per_group, budget_bytes)
        return cls(group_specs, state_specs, num_blocks, max_num_seqs)

    # -- pool-wide queries -----------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def num_usable_blocks(self) -> int:
        return self.pool.num_usable_blocks

    @property
    def num_free_state_slots(self) -> int:
        return len(self._free_slots)

    def has_request(self, request_id: str) -> bool:
        return request_id in self._reqs

    # -- per-request queries -----------------------------------------------------
    def get_block_tables(self, req: KVRequest) -> dict[int, list[int]]:
        """Group index -> copy of the request's table (entry i holds tokens [i*B, (i+1)*B); null = 0)."""
        rb = self._reqs.get(req.request_id)
        if rb is None:
            return {g: [] for g in range(len(self.group_specs))}
        return {g: list(t) for g, t in enumerate(rb.tables)}

    def state_slot(self, req: KVRequest) -> int:
        """The request's state slot in ``[0, max_num_seqs)``; KeyError if it holds none."""
        rb = self._reqs.get(req.request_id)
        if rb is None:
            raise KeyError(f"request {req.request_id!r} holds no KV state slot (not allocated or already freed)")
        return rb.state_slot

    def num_blocks_held(self, req: KVRequest) -> int:
        """Non-null block ids in the request's tables (all groups)."""
        rb = self._reqs.get(req.request_id)
        if rb is None:
            return 0
        return sum(1 for t in rb.tables for b in t if b != NULL_BLOCK_ID)

    def blocks_needed(self, req: KVRequest, num_new_tokens: int) -> int:
        """New block ids ``allocate_slots(req, num_new_tokens)`` would take from the pool.

        Blocks the same call would first return (behind a sliding window) are not
        subtracted; ``can_allocate`` answers the full question.
        """
        return self._plan(req, num_new_tokens)[0]

    def can_allocate(self, req: KVRequest, num_new_tokens: int) -> bool:
        needed, freeable = self._plan(req, num_new_tokens)
        slot_ok = req.request_id in self._reqs or bool(self._free_slots)
        return slot_ok and needed <= self.pool.num_free_blocks + freeable

    # -- allocation ------------------------------------------------------------
    def allocate_slots(self, req: KVRequest, num_new_tokens: int) -> bool:
        """Make every group's table cover tokens ``[0, num_computed_tokens + num_new_tokens)``.

        First returns sliding-window blocks that no future query can read (based
        on ``num_processed_tokens``), then takes new ids. All or nothing: on
        ``False`` (not enough free blocks or no free state slot) nothing changed.
        """
        needed, freeable = self._plan(req, num_new_tokens)
        rb = self._reqs.get(req.request_id)
        if rb is None and not self._free_slots:
            return False
        if needed > self.pool.num_free_blocks + freeable:
            return False
        if rb is None:
            rb = _RequestBlocks(len(self.group_specs), self._free_slots.popleft())
            self._reqs[req.request_id] = rb
        self.cache_full_blocks(req)
        self._free_skipped(rb, req.num_processed_tokens)
        new_ids = iter(self.pool.allocate(needed))
        total = req.num_computed_tokens + num_new_tokens
        for g, spec in enumerate(self.group_specs):
            table = rb.tables[g]
            skip = self._num_skipped(spec, req.num_processed_tokens)
            for i in range(len(table), _cdiv(total, spec.block_size)):
                # An entry already behind the window is never written: leave it null.
                table.append(NULL_BLOCK_ID if i < skip else next(new_ids))
        return True

    def free_skipped_blocks(self, req: KVRequest) -> int:
        """Return sliding-window blocks behind the window of ``num_processed_tokens``; count freed."""
        rb = self._reqs.get(req.request_id)
        if rb is None:
            return 0
        self.cache_full_blocks(req)
        return self._free_skipped(rb, req.num_processed_tokens)

    def free(self, req: KVRequest) -> None:
        """Return every block and the state slot of the request; a no-op if it holds none."""
        if req.request_id in self._reqs:
            self.cache_full_blocks(req)
        rb = self._reqs.pop(req.request_id, None)
        if rb is None:
            return
        for table in rb.tables:
            # Tail first, so that with a future prefix cache the shared head blocks stay longest.
            self.pool.free(reversed(table))
        self._free_slots.append(rb.state_slot)

    # -- admission helper --------------------------------------------------------
    def peak_blocks_alone(self, num_fed_tokens: int, first_chunk: int) -> int:
        """Most block ids a request ever holds when it runs alone in the pool.

        The request feeds tokens ``[0, num_fed_tokens)``: the first step feeds
        ``[0, first_chunk)``, every later step one token. A request whose peak
        exceeds ``num_usable_blocks`` can never finish.
        """
        if num_fed_tokens < 1 or first_chunk < 1:
            raise ValueError(f"num_fed_tokens and first_chunk must be at least 1, got {num_fed_tokens}, {first_chunk}")
        first_chunk = min(first_chunk, num_fed_tokens)
        peak = self._blocks_for_step(0, first_chunk)
        lo, hi = first_chunk, num_fed_tokens - 1
        # A sliding group's count at q+k*B is >= its count at q (equal once q >= W-1)
        # and a compressed count only grows, so every q is dominated by one in the
        # last period (lcm of sliding block sizes) below hi.
        period = math.lcm(*(s.block_size for s in self.group_specs if isinstance(s, SlidingWindowSpec)))
        for q in range(max(lo, hi - period + 1), hi + 1):
            peak = max(peak, self._blocks_for_step(q, 1))
        return peak

    def _blocks_for_step(self, q: int, n: int) -> int:
        """Blocks held while a lone request feeds ``[q, q+n)`` having processed ``q`` tokens."""
        total = 0
        for spec in self.group_specs:
            covered = _cdiv(q + n, spec.block_size)
            total += covered - min(covered, self._num_skipped(spec, q))
        return total

    # -- internals ---------------------------------------------------------------
    @staticmethod
    def _num_skipped(spec: PagedSpec, num_processed: int) -> int:
        """Leading blocks no future query reads: all their tokens lie below ``num_processed - W + 1``."""
        if isinstance(spec, SlidingWindowSpec):
            return max(0, num_processed - spec.window + 1) // spec.block_size
        return 0

    def _plan(self, req: KVRequest, num_new_tokens: int) -> tuple[int, int]:
        """(new ids needed, live ids the call would free first) for ``allocate_slots``."""
        if isinstance(num_new_tokens, bool) or not isinstance(num_new_tokens, int) or num_new_tokens < 0:
            raise ValueError(f"num_new_tokens must be a non-negative int, got {num_new_tokens!r}")
        processed, computed = req.num_processed_tokens, req.num_computed_tokens
        if not 0 <= processed <= computed:
            raise ValueError(
                f"request {req.request_id!r}: need 0 <= num_processed_tokens ({processed}) <= num_computed_tokens ({computed})"
            )
        rb = self._reqs.get(req.request_id)
        total = computed + num_new_tokens
        needed = freeable = 0
        for g, spec in enumerate(self.group_specs):
            have = len(rb.tables[g]) if rb else 0
            skip = self._num_skipped(spec, processed)
            want = _cdiv(total, spec.block_size)
            needed += max(0, want - max(have, skip))
            if rb and skip > rb.first_live[g]:
                freeable += sum(1 for b in rb.tables[g][rb.first_live[g] : skip] if b != NULL_BLOCK_ID)
        return needed, freeable

    def _free_skipped(self, rb: _RequestBlocks, num_processed: int) -> int:
        freed = 0
        for g, spec in enumerate(self.group_specs):
            table = rb.tables[g]
            skip = min(self._num_skipped(spec, num_processed), len(table))
            for i in range(rb.first_live[g], skip):
                if table[i] != NULL_BLOCK_ID:
                    self.pool.free((table[i],))
                    table[i] = NULL_BLOCK_ID
                    freed += 1
            rb.first_live[g] = max(rb.first_live[g], skip)
        return freed


    # -- prefix caching ----------------------------------------------------------
    def _hashes(self, token_ids: Sequence[int], g: int, num_blocks: int, known: list[int] | None = None) -> list[int]:
        """Chained hashes of the first ``num_blocks`` full blocks of group ``g`` (extends ``known``)."""
        bs = self.group_specs[g].block_size
        out = list(known or [])
        parent = out[-1] if out else hash(("deepinfer.kv", g, self.group_specs[g]))
        for i in range(len(out), num_blocks):
            parent = hash((parent, tuple(token_ids[i * bs:(i + 1) * bs])))
            out.append(parent)
        return out

    def cache_full_blocks(self, req) -> None:
        """Give every full, processed, live block of ``req`` its hash (no-op with caching off)."""
        if not self.enable_caching:
            return
        rb = self._reqs.get(req.request_id)
        if rb is None:
            return
        tokens = req.all_token_ids
        processed = min(req.num_processed_tokens, len(tokens))
        for g in self.cached_groups:
            spec = self.group_specs[g]
            full = min(processed // spec.block_size, len(rb.tables[g]))
            if full <= rb.num_hashed[g]:
                continue
            rb.hashes[g] = hashes = self._hashes(tokens, g, full, rb.hashes[g])
            for i in range(rb.num_hashed[g], full):
                b = rb.tables[g][i]
                if b != NULL_BLOCK_ID:
                    self.pool.set_block_hash(b, hashes[i])
                    if self.host is not None:
                        self._block_group[b] = g
            rb.num_hashed[g] = full

    def find_prefix(self, req) -> tuple[int, int, PrefixTables | None]:
        """Longest cached prefix of ``req``'s known tokens: ``(hit tokens h, replay R, tables)``.

        ``h`` is a multiple of every group's block size; the tables hold the cached ids
        (null where no future query reads). Returns ``(0, 0, None)`` on a miss. With a host
        tier, a block missing on the device but held by the host counts too (listed in
        ``tables.restores``), as long as enough free device blocks remain to copy it back.
        """
        tokens = req.all_token_ids
        n = len(tokens)
        top = n // self.align * self.align
        if not self.enable_caching or top == 0:
            return 0, 0, None
        hashes = {g: self._hashes(tokens, g, top // self.group_specs[g].block_size) for g in self.cached_groups}
        for h in range(top, 0, -self.align):
            r, floor = self._replay_span(h, n)
            if h - r <= 0:  # nothing saved (a bounded hit no longer than the window)
                continue
            tables: dict[int, list[int]] = {}
            restores: list[tuple[int, int, int]] = []
            for g, spec in enumerate(self.group_specs):
                nb = h // spec.block_size
                if g not in self.cached_groups:  # bounded: rebuilt by the replay, nothing to look up
                    tables[g] = [NULL_BLOCK_ID] * ((h - r) // spec.block_size)
                    continue
                lo = 0
                if isinstance(spec, SlidingWindowSpec):  # only the window before the replayed tokens
                    lo = max(0, h - r - spec.window + 1) // spec.block_size
                table = self._lookup_range(g, hashes[g], lo, nb, restores)
                if table is None:
                    break
                tables[g] = table
            else:
                if self._restorable(tables, restores):
                    return h, r, PrefixTables(tables, restores, floor)
        return 0, 0, None

    def _replay_span(self, h: int, n: int) -> tuple[int, int]:
        """(tokens before ``h`` to recompute, sliding-window floor) for a hit at ``h`` of ``n`` known tokens.

        Exact: the model's ``replay_tokens`` (at least one when ``h == n``, for logits), no floor.
        Bounded: the last ``w = min(window, h)`` tokens rebuild the sliding windows, floored at
        ``h - w``; ``history_tokens`` more before them only refill per-request token history
        (their own outputs are never read: every window is floored above them).
        """
        last = 1 if h == n else 0
        if not self.bounded:
            return max(self.replay_tokens, last), 0
        w = min(self.replay_window, h)
        return min(h, max(w + self.history_tokens, self.replay_tokens, last)), h - w

    def _lookup_range(self, g: int, hashes: list[int], lo: int, nb: int,
                      restores: list[tuple[int, int, int]]) -> list[int] | None:
        """Table of group ``g`` for entries ``[lo, nb)`` (null below ``lo``), or None if one is not cached.

        Entries held only by the host tier get a null placeholder and are appended to ``restores``.
        """
        table = [NULL_BLOCK_ID] * lo
        for i in range(lo, nb):
            b = self.pool.lookup(hashes[i])
            if b is None:
                if self.host is None or not self.host.contains(g, hashes[i]):
                    return None
                restores.append((g, i, hashes[i]))
                b = NULL_BLOCK_ID
            table.append(b)
        return table

    def _restorable(self, tables: Mapping[int, list[int]], restores: Sequence[tuple[int, int, int]]) -> bool:
        """Enough free device blocks for the restores once the hit's cached-free blocks are taken."""
        if not restores:
            return True
        taken = sum(1 for t in tables.values() for b in t if b != NULL_BLOCK_ID and self.pool.ref_count(b) == 0)
        return len(restores) <= self.pool.num_free_blocks - taken

    def allocate_prefix(self, req, tables: dict[int, list[int]]) -> bool:
        """Take the cached blocks of a hit for a request that holds nothing yet (False: no state slot)."""
        if req.request_id in self._reqs:
            raise ValueError(f"request {req.request_id!r} already holds blocks; prefix hits apply to fresh requests")
        if not self._free_slots:
            return False
        restores = getattr(tables, "restores", ())
        if restores and (self.host is None or not self._restorable(tables, restores)):
            return False
        rb = _RequestBlocks(len(self.group_specs), self._free_slots.popleft())
        for g, table in tables.items():
            for b in table:
                if b != NULL_BLOCK_ID:
                    self.pool.touch(b)  # first: the allocation below must not evict the hit's own blocks
            rb.tables[g] = list(table)
            rb.num_hashed[g] = len(table)
        if restores:
            for g, _, x in restores:  # the spills the allocation may cause must not drop these keys
                self.host.pin(g, x)
            for (g, i, x), b in zip(restores, self.pool.allocate(len(restores))):
                rb.tables[g][i] = b
                self.pool.set_block_hash(b, x)  # findable now; the copy runs before any step reads it
                self._block_group[b] = g
                self.host.restore(g, b, x)
            self.host.num_hits += 1
        for g, table in enumerate(rb.tables):
            rb.first_live[g] = next((i for i, b in enumerate(table) if b != NULL_BLOCK_ID), len(table))
        self._reqs[req.request_id] = rb
        return True

    # -- host tier -----------------------------------------------------------------
    def take_host_copies(self) -> list[HostCopy]:
        """Spills, restores and host drops recorded since the last call, in order ([] without a host tier).

        The engine calls this right after each non-empty ``schedule()`` and applies the list on
        the step worker before that step's forward (invariant: ``host_tier.py``).
        """
        return self.host.take_ops() if self.host is not None else []

    def has_host_copies(self) -> bool:
        """Whether ``take_host_copies`` would return copies (without taking them)."""
        return self.host is not None and bool(self.host._ops)

    def _spill(self, block_id: int, block_hash: int) -> None:
        """``BlockPool.on_evict``: the block's id is about to be reused; keep its contents on the host."""
        g, self._block_group[block_id] = self._block_group[block_id], -1
        if g >= 0:
            self.host.spill(g, block_id, block_hash)
