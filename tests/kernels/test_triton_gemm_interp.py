"""The general quantised GEMM kernels (``deepinfer_nvidia/kernels/triton_gemm.py``: ``_fp8_gemm_kernel``,
``_mxfp4_gemm_kernel``, ``_dense_gemm_kernel`` and the split-K sum) in Triton's CPU interpreter, against the
``gemm.*`` references. Until now only the H200 conformance files ran them.

fp32 activations only (the interpreter returns garbage for bf16 x bf16 ``tl.dot``: docs/performance.md, sixteenth
pass). The launchers are called directly, past the ``supports_*`` checks that send CPU tensors to the reference.
Covered: fp32 and UE8M0 block scales at [128, 128] and [32, 32] blocks, K and N that are not multiples of the
tiles, one split and split-K (the fixed-order ``sum_slices``), the grouped ``wo_a`` launch (``ng``), MXFP4 with a
split, the dense kernel on bf16 weights, and batch invariance of the ``bi_tiles`` launches: a row's bits do not
depend on the other rows."""
from __future__ import annotations

_INTERPRETED = r"""
import torch
from deepinfer_core.kernels.ops.gemm import dense, fp8_block, fp8_block_grouped, mxfp4
from deepinfer_core.kernels.ops.quant import quant_fp8_block, quant_mxfp4
from deepinfer_nvidia.kernels import triton_gemm as tg

g = torch.Generator().manual_seed(0)
n_checked = 0


def close(out, ref, what):
    global n_checked
    assert out.shape == ref.shape and out.dtype == ref.dtype, (what, out.shape, ref.shape, out.dtype)
    err = float((out - ref).abs().max() / ref.abs().max())
    assert err < 1e-5, (what, err)
    n_checked += 1


def fp8(x, q, s, block, tiles, ng=None):
    args = tg._prep_fp8(x[:, :q.shape[1]] if ng else x, q, s, block)
    return tg._launch_fp8(x if ng else args[0], *args[1:], tiles, ng=ng)


# FP8 block weights: (N, K, block, scale format); tiles (bm, bn, bk, split, warps, stages), the split forced
for n, k, block, fmt in ((96, 320, (128, 128), None), (80, 192, (32, 32), "ue8m0"), (64, 256, (128, 128), "ue8m0")):
    q, s = quant_fp8_block(torch.randn(n, k, generator=g) / k ** 0.5, block, fmt)
    for m, split in ((1, 1), (5, 4), (19, 2), (40, 1)):
        x = torch.randn(m, k, generator=g)
        ref = fp8_block(x, q, s, block)
        close(fp8(x, q, s, block, (16, 32, 32, split, 4, 3)), ref, ("fp8", n, k, block, fmt, m, split))
    # the default tile plan for these rows
    x = torch.randn(7, k, generator=g)
    close(fp8(x, q, s, block, tg._tiles(7, n, k, x.dtype, "cpu", block[1] & -block[1])), fp8_block(x, q, s, block),
          ("fp8 plan", n, k))

# grouped (V4's wo_a): G groups of [Ng, Kg], column tiles inside one group
G, ng, kg, block = 3, 64, 96, (32, 32)
q, s = quant_fp8_block(torch.randn(G * ng, kg, generator=g) / kg ** 0.5, block, "ue8m0")
x = torch.randn(6, G * kg, generator=g)
close(fp8(x, q, s, block, (16, 32, 32, 2, 4, 3), ng=ng), fp8_block_grouped(x, q, s, block, G), "fp8 grouped")

# MXFP4 (K a multiple of 32), one split and three
for n, k in ((96, 256), (48, 160)):
    p, sc = quant_mxfp4(torch.randn(n, k, generator=g) / k ** 0.5)
    for m, split in ((3, 1), (17, 3)):
        x = torch.randn(m, k, generator=g)
        xx, pp, ss = tg._prep_mxfp4(x, p, sc)
        close(tg._launch_mxfp4(xx, pp, ss, (16, 32, 32, split, 4, 3)), mxfp4(x, p, sc), ("mxfp4", n, k, m, split))

# dense on a bf16 weight (cast to fp32 in the kernel)
w = torch.randn(72, 200, generator=g).to(torch.bfloat16)
for m, split in ((2, 1), (21, 4)):
    x = torch.randn(m, 200, generator=g)
    close(tg._launch_dense(x, w, (16, 32, 32, split, 4, 3)), dense(x, w), ("dense", m, split))

# batch invariance of the bi tile plans: row 0 alone and among 24 others, bit for bit
q, s = quant_fp8_block(torch.randn(64, 256, generator=g) / 16, (128, 128), "ue8m0")
p, sc = quant_mxfp4(torch.randn(64, 256, generator=g) / 16)
wd = torch.randn(64, 256, generator=g).to(torch.bfloat16)
x = torch.randn(25, 256, generator=g)
tiles = tg.bi_tiles(64, 256, x.dtype, 128)
assert tiles[3] > 1, tiles  # the split is taken from (N, K): the partials' sum order is part of the check
for name, run in (("fp8", lambda xx: fp8(xx, q, s, (128, 128), tiles)),
                  ("mxfp4", lambda xx: tg._launch_mxfp4(xx, p, sc.view(torch.uint8), tiles)),
                  ("dense", lambda xx: tg._launch_dense(xx, wd, tiles))):
    many, one = run(x), run(x[:1].clone())
    assert torch.equal(many[:1], one), (name, float((many[:1] - one).abs().max()))
    n_checked += 1

# the split-K sum alone: fixed order, any strides
part = torch.randn(3, 4, 50, generator=g)
out = tg.sum_slices(part, 4, 50, 3, 200, 50, torch.float32)
assert torch.equal(out, part[0] + part[1] + part[2])
n_checked += 1
print("INTERPRETED", n_checked)
"""


def test_general_gemm_kernels_match_the_references_in_the_interpreter(run_interpreted):
    proc = run_interpreted(_INTERPRETED, "INTERPRETED")
    assert int(proc.stdout.split("INTERPRETED")[1].split()[0]) == 26
