"""HostTier: the bookkeeping of the prefix cache's second tier in host memory (plain ints, no tensors).

When the device ``BlockPool`` evicts a cached block (one with a hash) to reuse its id,
the block's contents are spilled to host memory under the key ``(group, hash)``; a later
prefix lookup that misses on the device but finds the key here is still a hit: a fresh
device block is allocated and the contents are copied back before the step that reads them.

Split of responsibilities (STYLE.md habit 11: the KV manager and pool never see a tensor):

- this class decides, at scheduling time, which keys are on the host (LRU order, a byte
  budget) and records every data movement as a ``HostCopy`` in one ordered list;
- ``deepinfer_core.runner.host_store.HostKVStore`` (owned next to the executor) holds the
  host tensors and replays the list, in order, on the thread that runs the model steps;
- the engine drains the list (``KVCacheManager.take_host_copies``) when it hands a planned
  step to the device, on the scheduling thread, with no step in flight and no ``schedule()``
  since the one that planned it; the step's thread applies it right before the step's forward
  (``LLMEngine._host_copies_then``).

Invariant (async scheduling: step N runs on the worker while step N+1 is planned): the
copies recorded while planning step N+1 run after step N's forward and before step N+1's.
That is exactly what they need:

- a spilled block carries a hash, so all its tokens were processed by steps that already
  finished and no step writes a hashed block again (in-flight steps only write positions at or
  past ``num_processed_tokens``; replayed tokens write nothing); its contents are intact until
  the step that first writes the block's new owner, which is step N+1 at the earliest;
- a restore target is a block allocated while planning step N+1; steps up to N that may still
  touch it (its previous owner was preempted or finished while they were in flight) run first;
- spills, restores and host-side drops are applied in the order they were recorded, so a
  block restored and then evicted again, or a key dropped and spilled again, in the same
  planning round sees the right data. Keys with a restore recorded since the last drain are
  pinned: a spill that needs room never drops them (it is skipped instead).

The host copy is inclusive: restoring a key leaves it on the host (moved to the LRU tail), so a
block that is restored and later evicted again costs no second copy. A schedule() that plans
nothing (a hit undone because the rest of the request did not fit) leaves its copies pending;
they are drained with the next step handed to the device, still before any step that could
read or overwrite their blocks, and the blocks they restore stay cached (hashed) meanwhile.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import NamedTuple

SPILL, RESTORE, DROP = "spill", "restore", "drop"


class HostCopy(NamedTuple):
    """One data movement for ``HostKVStore``: ``kind`` is

    - ``"spill"``: copy every cache row of device block ``block_id`` in group ``group``
      (all layers of the group) to a new host entry ``(group, key)``;
    - ``"restore"``: copy host entry ``(group, key)`` into device block ``block_id``;
    - ``"drop"``: free host entry ``(group, key)`` (``block_id`` is -1).

    ``key`` is the block's chained prefix-cache hash (``KVCacheManager._hashes``).
    """

    kind: str
    group: int
    block_id: int
    key: int


class HostTier:
    """LRU set of ``(group, hash)`` keys on the host, bounded by ``budget_bytes``.

    ``block_bytes[g]``: host bytes one spilled block of group ``g`` takes, i.e. the group's
    ``page_bytes`` times its number of cache layers (what ``HostKVStore`` allocates for it).
    """

    def __init__(self, budget_bytes: int, block_bytes: Mapping[int, int]) -> None:
        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 0:
            raise ValueError(f"host tier budget must be a non-negative int of bytes, got {budget_bytes!r}")
        for g, n in block_bytes.items():
            if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
                raise ValueError(f"block_bytes[{g}] must be a positive int, got {n!r}")
        self.budget_bytes = budget_bytes
        self.block_bytes = dict(block_bytes)
        self._lru: OrderedDict[tuple[int, int], None] = OrderedDict()  # head = least recently used
        self._pinned: set[tuple[int, int]] = set()
        self._ops: list[HostCopy] = []
        self.bytes_used = 0
        # metrics since start (see LLMEngine.prefix_cache_stats)
        self.num_spilled = 0  # blocks copied device -> host
        self.num_restored = 0  # blocks copied host -> device
        self.num_evictions = 0  # host entries dropped to make room
        self.num_skipped = 0  # evicted device blocks not spilled (no room: too big or all pinned)
        self.num_hits = 0  # prefix hits that restored at least one block

    # -- queries ---------------------------------------------------------------
    def contains(self, group: int, key: int) -> bool:
        return (group, key) in self._lru

    @property
    def num_blocks(self) -> int:
        return len(self._lru)

    @property
    def num_pending_ops(self) -> int:
        return len(self._ops)

    # -- recording (called by the KV manager while the scheduler plans a step) ----
    def spill(self, group: int, block_id: int, key: int) -> bool:
        """The device evicts ``block_id`` (group ``group``, hash ``key``): keep its contents.

        Returns True if the key is on the host afterwards. A key already there is only moved
        to the LRU tail (same hash, same contents). Otherwise least recently used, unpinned
        keys are dropped until the block fits; if it cannot fit the spill is skipped.
        """
        k = (group, key)
        if k in self._lru:
            self._lru.move_to_end(k)
            return True
        need = self.block_bytes[group]
        if need > self.budget_bytes:
            self.num_skipped += 1
            return False
        victims, free = [], self.budget_bytes - self.bytes_used
        for v in self._lru:  # LRU order; pinned keys wait for their restore to run
            if free >= need:
                break
            if v not in self._pinned:
                victims.append(v)
                free += self.block_bytes[v[0]]
        if free < need:
            self.num_skipped += 1
            return False
        for v in victims:  # drops first: the host never holds more than the budget
            del self._lru[v]
            self.bytes_used -= self.block_bytes[v[0]]
            self.num_evictions += 1
            self._ops.append(HostCopy(DROP, v[0], -1, v[1]))
        self._lru[k] = None
        self.bytes_used += need
        self.num_spilled += 1
        self._ops.append(HostCopy(SPILL, group, block_id, key))
        return True

    def pin(self, group: int, key: int) -> None:
        """Keep ``(group, key)`` until the next ``take_ops``: a restore from it is about to be recorded."""
        if (group, key) not in self._lru:
            raise KeyError(f"host tier holds no block ({group}, {key})")
        self._pinned.add((group, key))

    def restore(self, group: int, block_id: int, key: int) -> None:
        """Record a copy of host entry ``(group, key)`` into the freshly allocated device ``block_id``."""
        k = (group, key)
        if k not in self._lru:
            raise KeyError(f"host tier holds no block ({group}, {key})")
        self._lru.move_to_end(k)
        self.num_restored += 1
        self._ops.append(HostCopy(RESTORE, group, block_id, key))

    def take_ops(self) -> list[HostCopy]:
        """The copies recorded since the last call, in order; unpins every key.

        The caller must apply them (``HostKVStore.apply``) after every step already handed
        to the device and before the step planned with them.
        """
        ops, self._ops = self._ops, []
        self._pinned.clear()
        return ops
