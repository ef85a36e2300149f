"""How few shifts can the swap kernels' MXFP4 word decode take if the weights were repacked at load time?

    python -m deepinfer_nvidia.tests.decode_layout_search

The decode (``mxfp4_word_decode``) turns one 32-bit word (8 e2m1 nibbles) into 4 bf16x2 registers. Register p
takes two elements: their 3 magnitude bits must land on bits {6, 7, 8} and {22, 23, 24}, their sign bits on
{15, 31} (the value is then E2M1 * 2^-126, fixed by one ``mul.bf16x2``). Per register the kernel shifts the word
once for the magnitudes (by m_p) and once for the signs (by s_p), masks and merges: with the checkpoint's nibble
order m = (6, 2, -2, -6) and s = (12, 8, 4, 0), 7 shift instructions a word, ~19.5 instructions a word in all
(sm_90a SASS, docs/performance.md, twenty-seventh pass).

A load-time repacking may place the 32 bits anywhere. This searches, over rotations mod 32, for the cheapest
layout under ``cost`` (shifts, masks and merges, multiplies) that gives every register its 8 bits with no bit used
twice. What it found (5 s on a CPU):
- one rotation a register for both magnitudes and signs (one ``and`` and the multiply: 3 instructions a
  register) would need 4 translates of {6, 7, 8, 15, 22, 23, 24, 31} to tile the 32 bits, or 8 to tile a 64-bit
  pair of words through a funnel shift: neither exists;
- the cheapest layout costs 15 instructions a word against the checkpoint order's 19 (two registers on one
  rotation each, five distinct shift amounts): ~64 of the up kernel's 439 loop instructions, if the expert
  stacks were repacked once at load time (no load-time weight hook exists yet).
``tests/kernels/test_decode_layout_search.py`` ties ``cost`` to the kernel's PTX and checks both results.
"""
from __future__ import annotations

MAG = (6, 7, 8, 22, 23, 24)
SIGN = (15, 31)


def tiles(width: int, count: int) -> list[tuple[int, ...]]:
    """Offsets of ``count`` translates of MAG + SIGN (mod ``width``) that tile the ``width`` bits exactly."""
    pattern = MAG + SIGN
    found: list[tuple[int, ...]] = []

    def extend(used: frozenset[int], offs: tuple[int, ...]) -> None:
        if len(used) == width:
            found.append(offs)
            return
        first = min(set(range(width)) - used)
        for o in range(offs[-1] + 1 if offs else 0, width):
            cells = {(x + o) % width for x in pattern}
            if first in cells and not cells & used:
                extend(used | cells, offs + (o,))

    extend(frozenset(), ())
    return found


def _cells(mag_shift: int, sign_shift: int) -> int:
    """The bits of a repacked word that one register reads, as a 32-bit mask: its magnitudes before the shift
    by ``mag_shift``, its signs before the shift by ``sign_shift`` (rotations mod 32); fewer than 8 bits set when
    the two overlap."""
    bits = {(x - mag_shift) % 32 for x in MAG} | {(x - sign_shift) % 32 for x in SIGN}
    return sum(1 << b for b in bits)


def checkpoint_layout() -> tuple[tuple[int, int], ...]:
    """The kernel's (magnitude shift, sign shift) per register, as left rotations mod 32, from
    ``mxfp4_word_decode.CHECKPOINT_PLAN`` (a right shift by a is a left rotation by -a once masked)."""
    from deepinfer_nvidia.kernels.mxfp4_word_decode import CHECKPOINT_PLAN

    return tuple((m % 32, s % 32) for m, s in CHECKPOINT_PLAN)


def cost(layout) -> int:
    """Instructions a word: one shift per distinct non-zero amount, one ``and`` for a register whose magnitudes
    and signs come from the same shift (else an ``and`` and a ``lop3``), one ``mul.bf16x2`` a register."""
    amounts = {a for pair in layout for a in pair} - {0}
    return len(amounts) + sum(1 if m == s else 2 for m, s in layout) + len(layout)


def cheapest(bound: int) -> tuple[int, tuple[tuple[int, int], ...] | None]:
    """The cheapest layout under ``cost`` (below ``bound``): 4 registers' (magnitude shift, sign shift) that read
    every bit of a repacked word exactly once. Branch and bound over the registers in increasing order (they are
    interchangeable); the partial cost is a lower bound of the final one."""
    pairs = [(m, s, _cells(m, s)) for m in range(32) for s in range(32)]
    pairs = [p for p in pairs if bin(p[2]).count("1") == 8]
    best: list = [bound, None]

    def extend(chosen: tuple, used: int, amounts: frozenset[int], logic: int) -> None:
        left = 4 - len(chosen)
        if len(amounts) + logic + left * 2 + 4 >= best[0]:  # each further register: >= 1 logic op and its mul
            return
        if not left:
            best[0], best[1] = len(amounts) + logic + 4, chosen
            return
        for m, s, cells in pairs:
            if (chosen and (m, s) <= chosen[-1]) or cells & used:
                continue
            extend(chosen + ((m, s),), used | cells, amounts | ({m, s} - {0}), logic + (1 if m == s else 2))

    extend((), 0, frozenset(), 0)
    return best[0], best[1]


def main() -> None:
    print("one rotation a register, 32-bit words:", tiles(32, 4) or "no layout")
    print("one funnel shift a register, 64-bit word pairs:", tiles(64, 8) or "no layout")
    today = checkpoint_layout()
    print("checkpoint order (m, s) =", today, "cost", cost(today), "instructions a word")
    n, layout = cheapest(cost(today))
    print("cheapest repacked layout:", layout, "cost", n if layout else "none cheaper")


if __name__ == "__main__":
    main()
