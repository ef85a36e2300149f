"""BlockPool: ids, ref counts, FIFO free list, the reserved null block, hash hooks."""
from __future__ import annotations

import pytest

from deepinfer_core.kv.block_pool import NULL_BLOCK_ID, BlockPool, NoFreeBlocksError


def test_null_block_is_never_handed_out():
    pool = BlockPool(5)
    assert pool.null_block_id == NULL_BLOCK_ID == 0
    assert pool.num_usable_blocks == 4 and pool.num_free_blocks == 4
    ids = pool.allocate(4)
    assert sorted(ids) == [1, 2, 3, 4]
    assert pool.num_free_blocks == 0 and pool.usage == 1.0
    pool.free([NULL_BLOCK_ID, NULL_BLOCK_ID])  # null entries in a table are skipped
    assert pool.num_free_blocks == 0


def test_free_list_is_fifo():
    pool = BlockPool(6)
    a = pool.allocate(3)
    assert a == [1, 2, 3]
    pool.free([2])
    pool.free([1])
    # 4 and 5 were never used, so they come first; then 2 and 1 in the order freed.
    assert pool.allocate(4) == [4, 5, 2, 1]


def test_allocate_is_all_or_nothing():
    pool = BlockPool(4)
    pool.allocate(2)
    with pytest.raises(NoFreeBlocksError, match="asked for 2 blocks but only 1"):
        pool.allocate(2)
    assert pool.num_free_blocks == 1
    assert pool.allocate(0) == []


def test_ref_counts_and_sharing_hook():
    pool = BlockPool(4)
    (b,) = pool.allocate(1)
    assert pool.ref_count(b) == 1
    pool.incref([b, NULL_BLOCK_ID])
    assert pool.ref_count(b) == 2
    pool.free([b])
    assert pool.ref_count(b) == 1 and pool.num_free_blocks == 2  # still owned once
    pool.free([b])
    assert pool.ref_count(b) == 0 and pool.num_free_blocks == 3
    with pytest.raises(ValueError, match="double free"):
        pool.free([b])
    with pytest.raises(ValueError, match="is free"):
        pool.incref([b])


def test_block_hash_cleared_on_reuse():
    pool = BlockPool(2)
    (b,) = pool.allocate(1)
    pool.set_block_hash(b, 1234)
    assert pool.get_block_hash(b) == 1234
    pool.free([b])
    assert pool.get_block_hash(b) == 1234  # kept while free: a future prefix cache may revive it
    (b2,) = pool.allocate(1)
    assert b2 == b and pool.get_block_hash(b) is None
    pool.free([b])
    with pytest.raises(ValueError, match="not allocated"):
        pool.set_block_hash(b, 1)
    with pytest.raises(ValueError, match="not allocated"):
        pool.set_block_hash(NULL_BLOCK_ID, 1)


def test_bad_input_is_rejected():
    with pytest.raises(ValueError, match="at least 2"):
        BlockPool(1)
    with pytest.raises(TypeError, match="must be an int"):
        BlockPool(3.0)
    pool = BlockPool(3)
    with pytest.raises(ValueError, match=r"in \[0, 3\)"):
        pool.free([3])
    with pytest.raises(ValueError, match=r"in \[0, 3\)"):
        pool.ref_count(-1)
    with pytest.raises(ValueError, match="non-negative int"):
        pool.allocate(-1)
