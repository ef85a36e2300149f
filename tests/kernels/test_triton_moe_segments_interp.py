"""The segment MXFP4 expert kernels (``deepinfer_nvidia/kernels/triton_moe_segments.py``: ``_segments_kernel``,
``_up_seg_kernel``, ``_down_seg_kernel``, with ``triton_moe_splitk``'s ``_act_kernel`` and ``_finish_kernel``) in
Triton's CPU interpreter, through ``segments_mxfp4``. The interpreter cannot run inline PTX, so this is the
plain-Triton nibble decode (``asm=0``); the inline-PTX conversion is checked bit-for-bit against it in
``tests/kernels/test_gluon_swap_decode.py`` and on the H200 (``test_moe_experts_mxfp4_segments``).

Covered: the segment starts and count of ``_segments_kernel`` against a Python cut of the sorted experts (runs
shorter and longer than R, pair counts that are not powers of two); then against ``moe.experts_mxfp4``'s
reference: 1 to 20 tokens, top-k 2 to 6, R = 1 to 8 pairs a program, a routing that puts every pair on one
expert (runs cut into several segments, the last one short), D = 288 and F = 160 (9 and 5 MXFP4 groups: row
tiles of 16 to 256 and group tiles of 1 to 8 with tails), one K split and the deepest one (partials and
``_act_kernel``, uneven last splits), the module's default tiles, and the rejected R = 3.

The interpreter runs programs one after another in grid order, so a segment's program overwrites a stray write
into its rows by the segment before it; half the cases list the segments in reverse order, where such a write
comes last (a GPU runs them in any order).

No ``tl.dot`` here, so all three activation dtypes run: fp32 and fp16 within 1e-5 and 2e-3 of the output's
largest magnitude; bf16 within 3e-2, because the interpreter rounds fp32 -> bf16 toward zero (the reference
rounds to nearest), an error of up to one bf16 unit per rounding."""
from __future__ import annotations

_INTERPRETED = r"""
import torch
from tests.kernels.moe_cases import mxfp4_experts, routing
from deepinfer_core.kernels.ops.moe import experts_mxfp4
from deepinfer_nvidia.kernels import triton_moe_segments as sg
from deepinfer_nvidia.kernels.triton_moe_splitk import split_for

g = torch.Generator().manual_seed(0)
n = 0

# segment starts: every R-th pair of each run of one expert, counted from the run's first pair
for p, e, r in ((1, 4, 2), (6, 1, 4), (13, 5, 2), (37, 6, 4), (40, 3, 8), (17, 17, 1)):
    se = torch.sort(torch.randint(0, e, (p,), generator=g)).values.to(torch.int32)
    want, run = [], 0
    for i in range(p):
        run = i if i and se[i] != se[i - 1] else run  # first pair of the current run
        if (i - run) % r == 0:
            want.append(i)
    starts = torch.full((p,), -1, dtype=torch.int32)
    nseg = torch.zeros(1, dtype=torch.int32)
    sg._segments_kernel[(1,)](se, starts, nseg, p, R=r, PB=max(16, 1 << (p - 1).bit_length()))
    assert int(nseg) == len(want) and starts[:len(want)].tolist() == want, (p, e, r, int(nseg), starts, want)
    n += 1


# _segments_kernel with the segments listed last to first. The interpreter runs programs one after another in grid
# order, so a stray write into the next segment's rows would be overwritten by that segment's own program; in
# reverse order it comes last and shows in the output (a GPU runs them in any order).
class Reversed:
    def __getitem__(self, grid):
        def launch(se, starts, nseg, *args, **kwargs):
            kernel[grid](se, starts, nseg, *args, **kwargs)
            starts[:int(nseg)] = starts[:int(nseg)].flip(0)
        return launch


kernel = sg._segments_kernel
e, d, f = 6, 288, 160


ws = mxfp4_experts(g, e, d, f)
tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 3e-2}
deep = 1 << 20  # programs to aim for: forces the deepest K split
for dtype, t, k, route, r, tiles, splits, reverse in (
        (torch.float32, 1, 6, "rand", 2, dict(block_n=256, groups=1, programs=deep), (3, 2), True),
        (torch.float32, 1, 2, "rand", 2, {}, (1, 1), False),  # the defaults: 16-row tiles, 8 groups, 2048 programs
        (torch.float16, 3, 2, "one", 4, dict(block_n=64, groups=2, programs=deep), (2, 1), False),
        (torch.bfloat16, 2, 4, "rand", 8, dict(block_n=128, groups=4, programs=1), (1, 1), True),
        (torch.float32, 20, 2, "rand", 4, dict(block_n=256, groups=8, programs=1), (1, 1), False),
        (torch.float16, 20, 6, "rand", 4, dict(block_n=256, groups=8, programs=1), (1, 1), True),
        (torch.float16, 9, 2, "one", 8, dict(block_n=256, groups=8, programs=deep), (1, 1), True),
        (torch.bfloat16, 4, 6, "rand", 1, dict(block_n=256, groups=8, programs=1), (1, 1), False)):
    x = torch.randn(t, d, generator=g).to(dtype)
    ids = routing(g, t, k, e, route)
    w = torch.rand(t, k, generator=g)
    bn, gr, prog = tiles.get("block_n", 16), tiles.get("groups", 8), tiles.get("programs", 2048)
    plan = tuple(split_for(max(1, t * k // r), nn, kk // 32, bn, gr, prog)[0] for nn, kk in ((f, d), (d, f)))
    assert plan == splits, (t, k, r, plan)  # the case runs the split counts it is meant to
    ref = experts_mxfp4(x, w, ids, *ws, 1.0)  # limit 1.0: the clamps are active
    sg._segments_kernel = Reversed() if reverse else kernel
    out = sg.segments_mxfp4(x, w, ids, *ws, 1.0, pairs_per_program=r, asm=0, **tiles)
    err = float((out.float() - ref.float()).abs().max() / ref.float().abs().max())
    assert out.shape == ref.shape and out.dtype == dtype and err < tol[dtype], \
        (dtype, t, k, route, r, tiles, reverse, err)
    n += 1

try:  # R must be a power of two
    sg.segments_mxfp4(x, w, ids, *ws, 1.0, pairs_per_program=3, asm=0)
    raise AssertionError("pairs_per_program=3 was taken")
except ValueError as exc:
    assert "power of two" in str(exc), exc
    n += 1
print("INTERPRETED", n)
"""


def test_segment_experts_in_the_interpreter(run_interpreted):
    run_interpreted(_INTERPRETED, "INTERPRETED 15", timeout=600)
