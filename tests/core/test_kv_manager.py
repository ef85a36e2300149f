"""KVCacheManager: per-group block tables, sliding-window freeing, state slots, sizing."""
from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from deepinfer_core.kv.block_pool import NULL_BLOCK_ID
from deepinfer_core.kv.manager import KVCacheManager, bytes_per_block_id, num_blocks_from_memory_budget
from deepinfer_core.kv.spec import CompressedSpec, SlidingWindowSpec, StateSpec, group_cache_layers
from deepinfer_core.request import Request

SWA = SlidingWindowSpec((4,), torch.bfloat16, window=8, block_size=4)
C2 = CompressedSpec((6,), torch.float32, ratio=2, block_size=8)
STATE = StateSpec((3, 5), torch.float32)


def _req(rid: str = "r", n: int = 4) -> Request:
    return Request(rid, list(range(n)), SimpleNamespace(max_tokens=4))


def _step(kv: KVCacheManager, req: Request, n: int) -> bool:
    """Allocate n tokens, then mark them computed and processed (a finished sync step)."""
    ok = kv.allocate_slots(req, n)
    if ok:
        req.num_computed_tokens += n
    return ok


def test_compressed_group_grows_one_block_per_block_size_tokens():
    kv = KVCacheManager([C2], [], num_blocks=20, max_num_seqs=2)
    r = _req()
    for t in range(1, 50):
        assert _step(kv, r, 1)
        table = kv.get_block_tables(r)[0]
        assert len(table) == -(-t // 8)
        assert NULL_BLOCK_ID not in table  # compressed blocks are never freed early
    assert kv.num_free_blocks == 19 - 7


def test_sliding_window_frees_only_processed_blocks_and_nulls_entries():
    kv = KVCacheManager([SWA], [], num_blocks=30, max_num_seqs=2)
    r = _req()
    assert _step(kv, r, 20)  # prefill 20 tokens: blocks 0..4
    assert kv.get_block_tables(r)[0].count(NULL_BLOCK_ID) == 0
    # Next query is position 20, reading [13, 20]: blocks 0..2 (tokens 0..11) are dead.
    first = kv.get_block_tables(r)[0]
    assert kv.free_skipped_blocks(r) == 3
    table = kv.get_block_tables(r)[0]
    assert table[:3] == [NULL_BLOCK_ID] * 3 and table[3:] == first[3:]
    assert kv.num_free_blocks == 29 - 2

    # A step scheduled but still in flight does not count as processed.
    assert kv.allocate_slots(r, 8)  # tokens 20..27 -> blocks up to index 6
    r.num_computed_tokens += 8
    r.num_inflight_tokens = 8
    assert kv.free_skipped_blocks(r) == 0
    assert kv.allocate_slots(r, 1)  # still frees nothing: processed is 20
    r.num_computed_tokens += 1
    r.num_inflight_tokens += 1
    assert kv.get_block_tables(r)[0][3] != NULL_BLOCK_ID
    r.num_inflight_tokens = 0  # both steps reported back: processed = 29, window starts at 22
    assert kv.free_skipped_blocks(r) == 2  # blocks 3, 4 (tokens 12..19)
    table = kv.get_block_tables(r)[0]
    assert table[:5] == [NULL_BLOCK_ID] * 5 and len(table) == 8
    kv.free(r)
    assert kv.num_free_blocks == kv.num_usable_blocks


def test_sliding_window_holds_a_bounded_number_of_blocks_while_decoding():
    kv = KVCacheManager([SWA], [], num_blocks=8, max_num_seqs=1)
    r = _req()
    for _ in range(500):  # 500 tokens through a 7-block pool: only possible if the window frees
        assert _step(kv, r, 1)
        held = kv.num_blocks_held(r)
        assert held <= 3  # ceil((W-1)/B) + 1
    assert len(kv.get_block_tables(r)[0]) == 125


def test_computed_prefix_without_a_table_gets_null_window_entries():
    # What a future prefix-cache hit looks like: tokens count as computed before any table exists.
    kv = KVCacheManager([SWA, C2], [], num_blocks=20, max_num_seqs=1)
    r = _req()
    r.num_computed_tokens = 20
    assert kv.blocks_needed(r, 1) == 3 + 3  # SWA: blocks 3..5 (query 20 reads 13..20); C2: 0..2
    assert kv.allocate_slots(r, 1)
    swa, c2 = kv.get_block_tables(r)[0], kv.get_block_tables(r)[1]
    assert swa[:3] == [NULL_BLOCK_ID] * 3 and NULL_BLOCK_ID not in swa[3:] and len(swa) == 6
    assert len(c2) == 3 and NULL_BLOCK_ID not in c2
    assert kv.num_free_blocks == 19 - 6


def test_allocation_is_all_or_nothing_across_groups():
    kv = KVCacheManager([SWA, C2], [STATE], num_blocks=7, max_num_seqs=2)  # 6 usable
    a, b = _req("a"), _req("b")
    assert _step(kv, a, 8)  # SWA 2 blocks, C2 1 block
    assert kv.num_free_blocks == 3
    before = (kv.num_free_blocks, kv.get_block_tables(b), kv.num_free_state_slots)
    # 9 tokens: SWA needs 3, C2 needs 2 -> 5 > 3 free; SWA alone would fit.
    assert kv.blocks_needed(b, 9) == 5 and not kv.can_allocate(b, 9)
    assert not kv.allocate_slots(b, 9)
    assert (kv.num_free_blocks, kv.get_block_tables(b), kv.num_free_state_slots) == before
    assert not kv.has_request("b")
    with pytest.raises(KeyError, match="holds no KV state slot"):
        kv.state_slot(b)
    assert kv.allocate_slots(b, 4)  # 1 + 1 fits
    assert kv.num_free_blocks == 1


def test_state_slots_are_exclusive_and_returned():
    kv = KVCacheManager([C2], [STATE], num_blocks=20, max_num_seqs=3)
    reqs = [_req(f"r{i}") for i in range(4)]
    for r in reqs[:3]:
        assert kv.allocate_slots(r, 1)
    assert sorted(kv.state_slot(r) for r in reqs[:3]) == [0, 1, 2]
    assert not kv.can_allocate(reqs[3], 1) and not kv.allocate_slots(reqs[3], 1)
    freed_slot = kv.state_slot(reqs[1])
    kv.free(reqs[1])
    assert kv.allocate_slots(reqs[3], 1)
    assert kv.state_slot(reqs[3]) == freed_slot
    kv.free(reqs[1])  # freeing twice is a no-op
    for r in (reqs[0], reqs[2], reqs[3]):
        kv.free(r)
    assert kv.num_free_blocks == kv.num_usable_blocks and kv.num_free_state_slots == 3


def test_block_tables_are_snapshots():
    kv = KVCacheManager([SWA, C2], [], num_blocks=10, max_num_seqs=1)
    r = _req()
    assert kv.allocate_slots(r, 5)
    tables = kv.get_block_tables(r)
    assert set(tables) == {0, 1} and len(tables[0]) == 2 and len(tables[1]) == 1
    tables[0].append(99)
    assert len(kv.get_block_tables(r)[0]) == 2


def test_plan_matches_allocation_randomized():
    rng = random.Random(0)
    kv = KVCacheManager([SWA, C2, SlidingWindowSpec((2,), torch.float16, window=5, block_size=2)], [], 25, 4)
    reqs = [_req(f"r{i}") for i in range(4)]
    for _ in range(400):
        r = rng.choice(reqs)
        if rng.random() < 0.1:
            kv.free(r)
            r.num_computed_tokens = r.num_inflight_tokens = 0
            continue
        r.num_inflight_tokens = rng.randint(0, r.num_inflight_tokens)  # some in-flight tokens report back
        n = rng.randint(0, 12)
        expect = kv.can_allocate(r, n)
        needed = kv.blocks_needed(r, n)
        held_before = kv.num_blocks_held(r)
        ok = kv.allocate_slots(r, n)
        assert ok == expect
        if ok:
            r.num_computed_tokens += n
            r.num_inflight_tokens += n
            assert kv.num_blocks_held(r) - held_before <= needed  # net growth; window blocks may have gone
            for g, spec in enumerate(kv.group_specs):
                table = kv.get_block_tables(r)[g]
                assert len(table) == -(-r.num_computed_tokens // spec.block_size)
                # Entries that any query at or after the processed prefix reads are live.
                low = max(0, r.num_processed_tokens - getattr(spec, "window", 10**9) + 1)
                for i in range(low // spec.block_size, len(table)):
                    assert table[i] != NULL_BLOCK_ID
        # Accounting: every allocated id is held by exactly one table entry.
        held = [b for q in reqs for t in kv.get_block_tables(q).values() for b in t if b != NULL_BLOCK_ID]
        assert len(held) == len(set(held))
        assert len(held) + kv.num_free_blocks == kv.num_usable_blocks


def _brute_peak(kv: KVCacheManager, num_fed: int, first_chunk: int) -> int:
    """Run a lone request through a huge pool and record the most blocks it held."""
    big = KVCacheManager(list(kv.group_specs), [], num_blocks=10_000, max_num_seqs=1)
    r = _req()
    assert _step(big, r, min(first_chunk, num_fed))
    peak = big.num_blocks_held(r)
    while r.num_computed_tokens < num_fed:
        assert _step(big, r, 1)
        peak = max(peak, big.num_blocks_held(r))
    return peak


@pytest.mark.parametrize(
    "specs",
    [
        [SWA],
        [C2],
        [SWA, C2],
        [SlidingWindowSpec((1,), torch.float32, window=7, block_size=3), SlidingWindowSpec((2,), torch.float32, window=4, block_size=2)],
    ],
)
def test_peak_blocks_alone_matches_simulation(specs):
    kv = KVCacheManager(specs, [], num_blocks=4, max_num_seqs=1)
    for num_fed in (1, 2, 5, 9, 17, 40, 77):
        for first in (1, 3, num_fed):
            assert kv.peak_blocks_alone(num_fed, first) == _brute_peak(kv, num_fed, first), (num_fed, first)


def test_memory_budget_sizing():
    groups = group_cache_layers(
        [("l0.swa", SWA), ("l1.swa", SWA), ("l1.c2", C2), ("l1.state", STATE), ("l2.swa", SWA), ("l2.c2", C2)]
    )
    assert groups.paged_specs == (SWA, C2) and groups.state_specs == (STATE,)
    assert groups.paged_layers == (("l0.swa", "l1.swa", "l2.swa"), ("l1.c2", "l2.c2"))
    assert groups.layers_per_group == {0: 3, 1: 2}
    # SWA page: 4 tokens * 4 * 2 bytes = 32; C2 page: 4 entries * 6 * 4 bytes = 96.
    per_id = bytes_per_block_id(groups.paged_specs, groups.layers_per_group)
    assert per_id == 3 * 32 + 2 * 96
    assert num_blocks_from_memory_budget(groups.paged_specs, groups.layers_per_group, 100 * per_id + 5) == 100
    kv = KVCacheManager.from_memory_budget(groups.paged_specs, groups.state_specs, groups.layers_per_group, 10 * per_id, 4)
    assert kv.num_usable_blocks == 9
    with pytest.raises(ValueError, match="need at least 2"):
        num_blocks_from_memory_budget(groups.paged_specs, groups.layers_per_group, per_id)
    with pytest.raises(ValueError, match="exactly the keys 0..1"):
        bytes_per_block_id(groups.paged_specs, {0: 3})


def test_bad_specs_are_rejected():
    with pytest.raises(ValueError, match="equal specs"):
        KVCacheManager([SWA, SWA], [], 4, 1)
    with pytest.raises(TypeError, match="group_specs\\[0\\] must be"):
        KVCacheManager([STATE], [], 4, 1)
    with pytest.raises(TypeError, match="state_specs\\[0\\] must be"):
        KVCacheManager([SWA], [C2], 4, 1)
    with pytest.raises(ValueError, match="window must be at least 1"):
        KVCacheManager([SlidingWindowSpec((1,), torch.float32, window=0)], [], 4, 1)
    with pytest.raises(ValueError, match="max_num_seqs must be at least 1"):
        KVCacheManager([SWA], [], 4, 0)
    with pytest.raises(ValueError, match="listed twice"):
        group_cache_layers([("a", SWA), ("a", C2)])
    kv = KVCacheManager([SWA], [], 4, 1)
    with pytest.raises(ValueError, match="non-negative int"):
        kv.allocate_slots(_req(), -1)
    r = _req()
    r.num_inflight_tokens = 1
    with pytest.raises(ValueError, match="num_processed_tokens"):
        kv.allocate_slots(r, 1)
