"""BlockPool: the ids of the KV pages, their reference counts and a FIFO free list.

Pure Python over ints (STYLE.md habit 11): the pool never sees a tensor. The
model runner owns the memory: for every paged KV group it allocates one page
per block id per layer of that group, so a block id means "page ``id`` in every
tensor of the group that holds it". All paged groups draw ids from this one
pool; an id handed to one group is simply unused in the tensors of the other
groups (the price of one shared pool is that idle pages; the gain is that memory
flows freely between sliding-window and compressed groups as the load shifts).

Block 0 is reserved as the *null block*: block tables use it as a placeholder
for positions whose KV was freed (behind a sliding window) and the runner may
use it as padding. It is never allocated, never freed and has no ref count.

Prefix caching: a full, computed block can carry a hash of the token ids that
produced it (``set_block_hash``, chained over the blocks before it). A hashed
block whose last owner frees it stays findable (``lookup``) on the free list,
which is kept in LRU order: ``allocate`` takes the least recently freed block and
evicts its hash. ``touch`` takes a cached block back for a new owner (prefix hit).
``on_evict`` (optional) is told ``(block_id, hash)`` of every evicted block before the id is
handed out, while its pages still hold the cached contents (the host tier spills them).
``reuse_uncached_first`` (set by the manager in bounded-replay mode): a block freed without a
hash goes to the head of the free list, so it is reused before any cached block is evicted
(vLLM's order: uncached frees are prepended, cached ones appended).
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable

NULL_BLOCK_ID = 0


class NoFreeBlocksError(RuntimeError):
    """Raised by ``BlockPool.allocate`` when fewer free blocks remain than asked for."""


class BlockPool:
    """Ids ``1 .. num_blocks-1`` (block 0 is the null block), each with a ref count.

    Free list order is FIFO: ``allocate`` takes from the head, ``free`` appends
    to the tail, so the most recently freed block is reused last (which is the
    order a future prefix cache wants for LRU eviction).
    """

    def __init__(self, num_blocks: int) -> None:
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int):
            raise TypeError(f"num_blocks must be an int, got {type(num_blocks).__name__}")
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be at least 2 (block 0 is the reserved null block), got {num_blocks}")
        self.num_blocks = num_blocks
        self._ref_counts = [0] * num_blocks
        self._hashes: list[int | None] = [None] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(1, num_blocks))
        self._by_hash: dict[int, int] = {}
        self.num_evictions = 0
        self.on_evict: Callable[[int, int], None] | None = None
        self.reuse_uncached_first = False

    # -- queries ---------------------------------------------------------------
    @property
    def null_block_id(self) -> int:
        return NULL_BLOCK_ID

    @property
    def num_usable_blocks(self) -> int:
        """Blocks that can ever be allocated (all but the null block)."""
        return self.num_blocks - 1

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of usable blocks currently allocated, in [0, 1]."""
        return 1.0 - self.num_free_blocks / self.num_usable_blocks

    def ref_count(self, block_id: int) -> int:
        self._check_id(block_id)
        return self._ref_counts[block_id]

    # -- allocation ------------------------------------------------------------
    def allocate(self, n: int) -> list[int]:
        """Take ``n`` free blocks (ref count 1 each, hash cleared). All or nothing."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"number of blocks to allocate must be a non-negative int, got {n!r}")
        if n > len(self._free):
            raise NoFreeBlocksError(f"asked for {n} blocks but only {len(self._free)} of {self.num_usable_blocks} are free")
        ids = [self._free.popitem(last=False)[0] for _ in range(n)]
        for b in ids:
            self._ref_counts[b] = 1
            h = self._hashes[b]
            if h is not None:  # evict the cached content of the least recently freed block
                self._hashes[b] = None
                if self._by_hash.get(h) == b:
                    del self._by_hash[h]
                self.num_evictions += 1
                if self.on_evict is not None:
                    self.on_evict(b, h)
        return ids

    def incref(self, block_ids: Iterable[int]) -> None:
        """Add one owner to each (already allocated) block: the sharing hook for prefix caching."""
        for b in block_ids:
            self._check_id(b)
            if b == NULL_BLOCK_ID:
                continue
            if self._ref_counts[b] == 0:
                raise ValueError(f"block {b} is free; only an allocated block can gain an owner")
            self._ref_counts[b] += 1

    def free(self, block_ids: Iterable[int]) -> None:
        """Drop one owner from each block; a block whose count reaches 0 goes to the free list tail.

        The null block is skipped, so a block table with null entries can be
        freed as is. Freeing a block that is already free is a bookkeeping bug
        and raises ``ValueError``.
        """
        for b in block_ids:
            self._check_id(b)
            if b == NULL_BLOCK_ID:
                continue
            if self._ref_counts[b] == 0:
                raise ValueError(f"block {b} is already free (double free)")
            self._ref_counts[b] -= 1
            if self._ref_counts[b] == 0:
                self._free[b] = None  # most recently freed: evicted last
                if self.reuse_uncached_first and self._hashes[b] is None:
                    self._free.move_to_end(b, last=False)  # holds nothing findable: reuse it first

    # -- prefix-caching hooks --------------------------------------------------
    def set_block_hash(self, block_id: int, block_hash: int) -> None:
        """Record the hash of the (full, computed) block's content; cleared when the block is reallocated.

        If another block already holds the same content, the existing mapping is kept
        (both blocks stay valid; only one is findable).
        """
        self._check_id(block_id)
        if block_id == NULL_BLOCK_ID or self._ref_counts[block_id] == 0:
            raise ValueError(f"block {block_id} is not allocated; only an allocated block can carry a hash")
        if self._hashes[block_id] is not None:
            return
        self._hashes[block_id] = block_hash
        self._by_hash.setdefault(block_hash, block_id)

    def lookup(self, block_hash: int) -> int | None:
        """The block holding the content with ``block_hash`` (allocated or cached-free), or None."""
        return self._by_hash.get(block_hash)

    def touch(self, block_id: int) -> None:
        """Add an owner to a block found by ``lookup``: taken off the free list if it was cached-free."""
        self._check_id(block_id)
        if block_id == NULL_BLOCK_ID or self._hashes[block_id] is None:
            raise ValueError(f"block {block_id} holds no cached content")
        if self._ref_counts[block_id] == 0:
            del self._free[block_id]
        self._ref_counts[block_id] += 1

    @property
    def num_cached_blocks(self) -> int:
        """Blocks whose content is findable by hash (owned or free-but-cached)."""
        return len(self._by_hash)

    def get_block_hash(self, block_id: int) -> int | None:
        self._check_id(block_id)
        return self._hashes[block_id]

    # -- internals ---------------------------------------------------------------
    def _check_id(self, block_id: int) -> None:
        if isinstance(block_id, bool) or not isinstance(block_id, int) or not 0 <= block_id < self.num_blocks:
            raise ValueError(f"block id must be an int in [0, {self.num_blocks}), got {block_id!r}")
