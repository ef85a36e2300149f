"""The MXFP4 decode's instruction model (``deepinfer_nvidia/tests/decode_layout_search.py``) against the kernel's
own PTX, and the two results docs/performance.md (twenty-seventh pass) quotes: no repacked bit layout lets one
rotation serve a whole register, and the cheapest repacking costs 15 instructions a word against today's 19."""
from __future__ import annotations

import re

from deepinfer_nvidia.kernels.mxfp4_word_decode import _word_asm
from deepinfer_nvidia.tests import decode_layout_search as search


def _covers_every_bit_once(layout) -> bool:
    masks = [search._cells(m, s) for m, s in layout]
    return all(bin(c).count("1") == 8 for c in masks) and sum(masks) == (1 << 32) - 1 and \
        len({c for c in masks}) == len(masks) and all(a & b == 0 for i, a in enumerate(masks) for b in masks[i + 1:])


def test_the_model_describes_the_kernel_decode():
    today = search.checkpoint_layout()
    # nibble j of the checkpoint word sits at bits 4j..4j+3 (sign on top): the model's registers read each once
    assert _covers_every_bit_once(today)
    for p, (m, s) in enumerate(today):
        want = {4 * p, 4 * p + 1, 4 * p + 2, 4 * p + 3, 4 * p + 16, 4 * p + 17, 4 * p + 18, 4 * p + 19}
        assert {b for b in range(32) if search._cells(m, s) >> b & 1} == want, p
    # and its cost counts the instructions of the fast (SAFE=0) PTX: shifts, and/lop3 merges, bf16x2 multiplies
    asm = _word_asm(False)
    ops = re.findall(r"\b(shl|shr|and|lop3|mul)\.", asm)
    assert len(ops) == search.cost(today) == 19, ops


def test_no_single_rotation_layout_and_the_cheapest_repacking():
    assert search.tiles(32, 4) == [] and search.tiles(64, 8) == []
    n, layout = search.cheapest(search.cost(search.checkpoint_layout()))
    assert n == 15 and search.cost(layout) == 15 and _covers_every_bit_once(layout), layout
    assert search.cheapest(15) == (15, None)  # nothing cheaper than 15
