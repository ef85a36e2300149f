"""``pack_step`` with and without ``TableRowCache``: the packed tensor is identical in every case,
including rows changed in place, requests that take over a freed slot, width changes and cut rows."""
import random

import torch

from deepinfer_core.kv.spec import CompressedSpec, SlidingWindowSpec
from deepinfer_core.runner.context import SeqSlice, TableRowCache, pack_step

SPECS = {
    0: SlidingWindowSpec(block_size=4, entry_shape=(8,), dtype=torch.bfloat16, window=8),
    1: CompressedSpec(block_size=4, entry_shape=(8,), dtype=torch.bfloat16, ratio=2),
}


def _slices(rng: random.Random, n: int, length: int) -> list[SeqSlice]:
    return [SeqSlice(rng.randrange(0, 40), 1, {g: [rng.randrange(1, 500) for _ in range(length)] for g in SPECS},
                     state_slot=i, no_write_before=rng.randrange(0, 3)) for i in range(n)]


def _both(cache: TableRowCache, slices, widths=None, reads=None, ids=None):
    plain = pack_step(slices, SPECS, ids, widths, reads)
    cached = pack_step(slices, SPECS, ids, widths, reads, cache)
    assert plain[1] == cached[1]
    assert torch.equal(plain[0], cached[0])
    return cached[0]


def test_cache_matches_plain_packing_step_after_step():
    rng = random.Random(0)
    cache = TableRowCache()
    slices = _slices(rng, 6, 5)
    widths, reads = {0: 8, 1: 8}, {1: 16}
    first = _both(cache, slices, widths, reads, ids=list(range(6)))
    assert len(cache) == 2 * 6
    # unchanged rows: served from the cache, same bytes
    assert torch.equal(_both(cache, slices, widths, reads, ids=list(range(6))), first)
    # a row changed in place (same length: a block freed behind the window becomes the null block)
    slices[2].block_tables[0][1] = 0
    # a row that grew (a new block), one that another request's tables replaced on the same slot
    slices[4].block_tables[1].append(777)
    slices[5] = SeqSlice(3, 1, {g: [rng.randrange(1, 500) for _ in range(3)] for g in SPECS}, state_slot=5)
    after = _both(cache, slices, widths, reads, ids=list(range(6)))
    assert not torch.equal(after, first)
    assert len(cache) == 2 * 6  # one entry per (group, slot)


def test_cache_follows_width_changes_and_cuts_long_rows():
    rng = random.Random(1)
    cache = TableRowCache()
    slices = _slices(rng, 3, 6)
    for widths in ({0: 8, 1: 8}, {0: 4, 1: 4}, {0: 6, 1: 10}, None, {0: 8, 1: 8}):
        packed = _both(cache, slices, widths, {1: 8})
        if widths == {0: 4, 1: 4}:  # rows cut to the width: only their first 4 entries travel
            tables = packed[3 * 6:].view(2, 3, 4)
            assert tables[0].tolist() == [s.block_tables[0][:4] for s in slices]


def test_padding_rows_share_one_slot_and_empty_tables():
    cache = TableRowCache()
    real = _slices(random.Random(2), 2, 3)
    pad = SeqSlice(0, 1, {g: [] for g in SPECS}, state_slot=99, no_write_before=1)
    packed = _both(cache, real + [pad] * 3, {0: 4, 1: 4}, {1: 8}, ids=[1, 2, 0, 0, 0])
    tables = packed[5 + 5 * 6:].view(2, 5, 4)
    assert tables[:, 2:].eq(0).all()


def test_random_steps_against_plain_packing():
    rng = random.Random(3)
    cache = TableRowCache()
    slices = _slices(rng, 8, 4)
    for _ in range(50):
        i = rng.randrange(len(slices))
        g = rng.choice(list(SPECS))
        op = rng.randrange(3)
        if op == 0:
            slices[i].block_tables[g].append(rng.randrange(1, 500))
        elif op == 1 and slices[i].block_tables[g]:
            slices[i].block_tables[g][rng.randrange(len(slices[i].block_tables[g]))] = rng.randrange(0, 500)
        else:
            rng.shuffle(slices)  # the batch order changes: rows are keyed by slot, not by position
        _both(cache, slices, {0: 8, 1: 8}, {1: 16}, ids=[rng.randrange(100) for _ in slices])


def test_group_bytes_reused_only_while_every_row_and_slot_matches():
    """The group-level shortcut: the last step's joined bytes come back only for the same slots and rows."""
    rng = random.Random(4)
    cache = TableRowCache()
    slices = _slices(rng, 5, 4)
    rows = [s.block_tables[0] for s in slices]
    slots = [s.state_slot for s in slices]
    first = cache.group_bytes(0, slots, rows, 6)
    assert cache.group_bytes(0, slots, rows, 6) is first  # unchanged: the very same bytes object
    rows[3][0] = 999  # in place: the stored copies differ now
    changed = cache.group_bytes(0, slots, rows, 6)
    assert changed != first and changed == pack_step(slices, {0: SPECS[0]}, None, {0: 6})[0][5 * 6:].numpy().tobytes()
    assert cache.group_bytes(0, slots[::-1], rows[::-1], 6) != changed  # another order
    assert cache.group_bytes(0, slots, rows, 8) != changed  # another width


def test_decode_steps_take_the_one_token_path_with_the_general_paths_metadata():
    """A step where every request brings one token (``one_token_each``) builds its token index without
    repeat_interleave / cumsum / gathers: positions, token -> request map and every group's write / read
    metadata equal the general path's, and a step with a longer request keeps the general path."""
    from dataclasses import replace

    from deepinfer_core.runner.context import context_from_packed

    rng = random.Random(7)
    for n in (1, 5, 17):
        slices = [replace(s, window_floor=rng.randrange(0, 5)) for s in _slices(rng, n, 12)]
        host, layout = pack_step(slices, SPECS)
        assert layout.one_token_each
        general = replace(layout, one_token_each=False)
        caches = {}
        fast = context_from_packed(host, layout, SPECS, {}, caches, slices)[1]
        ref = context_from_packed(host, general, SPECS, {}, caches, slices)[1]
        assert fast.one_token_each and not ref.one_token_each  # the flag models read the decode shortcuts by
        for name in ("positions", "token_seq", "state_slots"):
            assert torch.equal(getattr(fast, name), getattr(ref, name)), name
        for key in ("token_start", "seq_first_row", "seq_end", "window_floor", "seq_start"):
            assert torch.equal(fast.extras[key], ref.extras[key]), key
        for gid in SPECS:
            for field in ("write_slots", "read_idx"):
                assert torch.equal(getattr(fast.groups[gid], field), getattr(ref.groups[gid], field)), (gid, field)
    two = _slices(rng, 3, 12)
    two[1] = replace(two[1], num_tokens=2)
    assert not pack_step(two, SPECS)[1].one_token_each
