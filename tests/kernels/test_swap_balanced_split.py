"""The balanced up launch's split of the paired swap experts (``gluon_swap_balanced``): its Python model, no GPU.

What the kernel relies on: every (tile, step) unit is covered once; a tile meets at most ``MAX_SEGMENTS`` programs
(a program may cover many whole tiles when there are fewer units than programs x steps)
(the partial buffer's depth) and its segments' slots run 0, 1, ... in program order (the finisher adds them in that
order); the kernel's own count of a tile's segments (``nseg``) matches; no program takes more than ``L`` units. And
at V4.1's one-token shape the busiest SM does 34 steps instead of 40.
"""
from __future__ import annotations

import random

import pytest

gb = pytest.importorskip("deepinfer_nvidia.kernels.gluon_swap_balanced")


def _check(blocks: int, nt: int, steps: int, programs: int) -> list[list[tuple[int, int, int, int]]]:
    units = blocks * nt * steps
    per = gb.units_per_program(units, programs, steps)
    split = gb.segments(units, programs, steps)
    assert len(split) == programs
    seen = {}
    for p, segs in enumerate(split):
        assert sum(s1 - s0 for _, s0, s1, _ in segs) <= per
        for tile, s0, s1, slot in segs:
            assert 0 <= s0 < s1 <= steps
            seen.setdefault(tile, []).append((p, s0, s1, slot))
    assert sorted(seen) == list(range(blocks * nt))
    for tile, parts in seen.items():
        parts.sort()
        assert [s for _, s, _, _ in parts][0] == 0 and parts[-1][2] == steps  # the whole tile, in order
        assert all(a[2] == b[1] for a, b in zip(parts, parts[1:]))  # no gap, no overlap
        assert [slot for *_, slot in parts] == list(range(len(parts)))
        nseg = (tile * steps + steps - 1) // per - (tile * steps) // per + 1  # the kernel's count
        assert nseg == len(parts) <= gb.MAX_SEGMENTS
    return split


def test_v41_one_token():
    """6 blocks x 36 row tiles x 20 steps over 264 programs (two an SM on 132 SMs): 17 units a program, so an SM's
    two programs do at most 34 steps where the unsplit launch's busiest SMs do 40."""
    split = _check(6, 36, 20, 264)
    loads = [sum(s1 - s0 for _, s0, s1, _ in segs) for segs in split]
    assert max(loads) == 17 and sum(loads) == 6 * 36 * 20
    busiest = max(loads[i] + loads[i + 132] for i in range(132))  # program i and i + 132 share an SM
    assert busiest <= 34 < 40


@pytest.mark.parametrize("seed", range(40))
def test_random_shapes(seed):
    rng = random.Random(seed)
    _check(rng.randint(1, 12), rng.randint(1, 80), rng.randint(1, 24), rng.randint(1, 300))


def test_takes_only_one_token_up_launches(monkeypatch):
    monkeypatch.setattr(gb, "BALANCED", True)
    avail = gb._swap.available()
    assert gb.takes(True, 6, 6) == avail
    assert not gb.takes(False, 6, 6) and not gb.takes(True, 12, 6)
    monkeypatch.setattr(gb, "BALANCED", False)
    assert not gb.takes(True, 6, 6)
