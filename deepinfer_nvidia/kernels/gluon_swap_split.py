"""How the swap experts' up launch (``gluon_moe_swap``) is split over K at small batches, and its register cap.

Policy only, no kernels: ``swap_mxfp4`` asks ``split_for`` for the up launch's K splits and ``up_options`` for its
compile options. Each split program of a (block, N tile) covers a range of K tiles and stores fp32 partials; the
last to arrive adds them in split order, so a split result differs from the unsplit one only in the order of the
fp32 sums (docs/performance.md, nineteenth pass).

Knobs (module attributes, so benchmarks and tests can set them):
- ``SPLIT_UP`` splits when the launch fills between ``SPLIT_WAVES[0]`` and ``SPLIT_WAVES[1]`` waves of
  ``RESIDENT_UP`` programs per SM. H200, V4.1 widths (nineteenth pass): 151.5 -> 126.4 us a layer at 2 tokens
  (432 programs: 1.09 waves, the second almost empty), 178.7 -> 165.6 at 3, 202.2 -> 196.6 at 4, 314.6 -> 296.7
  at 6; none at 1 token (216 programs: 79.2 -> 79.7) or 8 (1836: 338 -> 340). Splitting the down launch lost at
  every size (1-6 tokens: +2-7%), so it is never split by default. ``SPLIT_UP = 1`` turns it off.
- ``SPLIT_FILL``: below ``SPLIT_WAVES[0]`` waves, split into as many ranges as still fit in one wave (at 1 token:
  216 programs at ~1.6 an SM, each warp's chain of copies, decode and wgmma then has company).
- ``UP_MAXNREG``: the up kernel's register cap (None: the compiler's choice, 135 a thread at the 16-pair tiles:
  3 programs of 4 warps an SM; 128: 4 programs, with 4 spilled registers outside the loop: sass_count, Triton 3.6).
- ``SPLIT_MIN_TILES``: no split range shorter than this many K tiles.
"""
from __future__ import annotations

SPLIT_UP = 3
SPLIT_WAVES = (1.0, 3.5)
SPLIT_FILL = False
UP_MAXNREG: int | None = None
RESIDENT_UP = 3
SPLIT_MIN_TILES = 4


def split_for(programs: int, k_tiles: int, sms: int) -> int:
    """K splits of an up launch of ``programs`` (block, N tile) programs of ``k_tiles`` K tiles each on ``sms``
    SMs (see the module docstring), evened out so that no split is empty."""
    slots = max(1, RESIDENT_UP * sms)
    waves = programs / slots
    most = min(SPLIT_UP, max(1, k_tiles // SPLIT_MIN_TILES))
    if SPLIT_UP <= 1:
        return 1
    if SPLIT_WAVES[0] < waves <= SPLIT_WAVES[1]:
        return even_split(most, k_tiles)
    if SPLIT_FILL and waves <= SPLIT_WAVES[0]:
        return even_split(min(most, max(1, slots // max(1, programs))), k_tiles)
    return 1


def even_split(split: int, k_tiles: int) -> int:
    """The split count that ``cdiv(k_tiles, cdiv(k_tiles, split))`` tiles per split actually gives."""
    split = max(1, min(split, k_tiles))
    return -(-k_tiles // -(-k_tiles // split))


def up_options(maxnreg: int | None = None) -> dict:
    """Compile options of the up launch: ``maxnreg`` (default ``UP_MAXNREG``) when set."""
    cap = UP_MAXNREG if maxnreg is None else maxnreg
    return {"maxnreg": int(cap)} if cap else {}
