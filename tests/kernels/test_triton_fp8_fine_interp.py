"""The fine-block FP8 GEMM (``deepinfer_nvidia/kernels/triton_fp8_fine.py``: ``_fp8_fine_kernel``, K tiles that
span several scale blocks, for V4.1's [32, 32] UE8M0 linears) in Triton's CPU interpreter against the
``gemm.fp8_block`` and ``gemm.fp8_block_grouped`` references. Until now only the H200 conformance file ran it.
``triton_gemm`` sends products here only on the GPU, so the script prepares the operands with
``triton_gemm._prep_fp8`` / ``_grouped_operands`` and calls ``gemm_fp8_fine`` directly.

Covered: fp32 and UE8M0 scales; scale blocks [32, 32], [16, 16] (8 a K tile), [64, 64] and [128, 32] (a scale
row spanning two column tiles); N and K that are not multiples of the tiles or of the scale block (K 300: a
partial last scale block); the three row tilings (16, 64 and 128 rows; 1, 3, 5, 19 and 130 rows: two 128-row
tiles); split-K from 1 to 8 (the plan forced through ``sms``; ``triton_gemm``'s fixed-order sum) with 32-, 64-
and 128-wide K tiles; and the grouped ``wo_a`` launch (``ng``, one split and two). Activations in fp32 (the ieee
dot; error < 1e-5 of the largest output) and fp16, a dtype the kernel serves on the GPU (error < 1e-3 of the
largest output, about one fp16 unit: the dequantised weight is rounded to fp16 as the reference does). Not bf16:
Triton 3.9's interpreter returns garbage for bf16 x bf16 ``tl.dot`` (its fp16 dots are right), so bf16 is
checked on the H200 (``deepinfer_nvidia/tests/test_conformance.py::test_fp8_fine_blocks``)."""
from __future__ import annotations

_INTERPRETED = r"""
import torch
from deepinfer_core.kernels.ops.gemm import fp8_block, fp8_block_grouped
from deepinfer_core.kernels.ops.quant import quant_fp8_block
from deepinfer_nvidia.kernels import triton_fp8_fine as ff
from deepinfer_nvidia.kernels import triton_gemm as tg

g = torch.Generator().manual_seed(0)
TOL = {torch.float32: 1e-5, torch.float16: 1e-3}
n_checked = 0
grids, row_tiles = [], set()
kernel = ff._fp8_fine_kernel


class Spy:  # records each launch's grid (row tiles, column tiles, K splits)
    def __getitem__(self, grid):
        grids.append(grid)
        return kernel[grid]


ff._fp8_fine_kernel = Spy()


def close(out, ref, what):
    global n_checked
    assert out.shape == ref.shape and out.dtype == ref.dtype, (what, out.shape, ref.shape, out.dtype)
    err = float((out.float() - ref.float()).abs().max() / ref.float().abs().max())
    assert err < TOL[ref.dtype], (what, err)
    n_checked += 1


# (N, K, scale block, scale format); rows with (sms, knobs): sms 0 keeps one split, 64 asks for the most
for n, k, block, fmt in ((80, 300, (32, 32), None), (72, 512, (32, 32), "ue8m0"), (64, 200, (16, 16), "ue8m0"),
                         (40, 256, (64, 64), None), (200, 160, (128, 32), None)):
    q, s = quant_fp8_block(torch.randn(n, k, generator=g) / k ** 0.5, block, fmt)
    for m, sms, knobs in ((1, 0, {}), (5, 64, {}), (19, 64, {"block_k": 64}), (130, 0, {}),
                          (3, 64, {"block_k": 32, "block_n": 32})):
        if knobs.get("block_k", 128) < block[1]:
            continue  # a K tile is a whole number of scale blocks
        for dt in (torch.float32, torch.float16):
            x = torch.randn(m, k, generator=g).to(dt)
            xx, qq, ss, s_cols, bn_blk, bk_blk, e8 = tg._prep_fp8(x, q, s, block)
            out = ff.gemm_fp8_fine(xx, qq, ss, s_cols, bn_blk, bk_blk, e8, sms, **knobs)
            close(out, fp8_block(x, q, s, block), (n, k, block, fmt, m, sms, knobs, dt, grids[-1]))
            row_tiles.add(ff.fine_tiles(m, n, k, sms, **knobs)[0])

# the plans taken above: every row tiling, two row tiles, one split and split-K (2 and 4)
assert row_tiles == {16, 64, 128} and max(grid[0] for grid in grids) == 2, (row_tiles, grids)
assert {grid[2] for grid in grids} >= {1, 2, 4}, grids

# grouped (V4's wo_a): G groups of [Ng, Kg], x [M, G*Kg]; Ng a multiple of the column tile
G, ng, kg, block = 3, 64, 288, (32, 32)
first = len(grids)
for fmt in (None, "ue8m0"):
    q, s = quant_fp8_block(torch.randn(G * ng, kg, generator=g) / kg ** 0.5, block, fmt)
    for m, sms, knobs in ((1, 0, {}), (6, 64, {"block_n": 32, "block_k": 64})):
        for dt in (torch.float32, torch.float16):
            x = torch.randn(m, G * kg, generator=g).to(dt)
            xx, qq, ss, s_cols, bn_blk, bk_blk, e8, _, ngg = tg._grouped_operands(x, q, s, block, G)
            out = ff.gemm_fp8_fine(xx, qq, ss, s_cols, bn_blk, bk_blk, e8, sms, ng=ngg, **knobs)
            close(out, fp8_block_grouped(x, q, s, block, G), ("grouped", fmt, m, sms, knobs, dt, grids[-1]))
assert max(grid[2] for grid in grids[first:]) == 2, grids[first:]  # the grouped launch with split-K too
print("INTERPRETED", n_checked)
"""


def test_fine_block_fp8_gemm_matches_the_references_in_the_interpreter(run_interpreted):
    proc = run_interpreted(_INTERPRETED, "INTERPRETED")
    assert int(proc.stdout.split("INTERPRETED")[1].split()[0]) == 56
