"""``index.candidate_blocks``'s Triton path (``triton_topk.candidate_blocks_triton``: block maxima with the newest
visible block forced, then the top-k select) against the reference in Triton's CPU interpreter: the op's own
cases, V4.1's block of 8 with rows of 1000 scores, rows with nothing visible, every block kept (topk_blocks past
the block count), exact ties between blocks, N not a multiple of the block, and the streamed select, with 4-bit
digits and the bisection. The kept
set must equal the reference's, in ascending id order, ``-1`` only after the kept ids."""
from __future__ import annotations

_INTERPRETED = r"""
import torch
from deepinfer_core.kernels.ops.candidates import _gen_blocks, candidate_blocks
from deepinfer_nvidia.kernels import triton_topk as tt


def check(s, vis, bs, kb):
    got, want = tt.candidate_blocks_triton(s, vis, bs, kb, force_kernel=True), candidate_blocks(s, vis, bs, kb)
    assert got.shape == want.shape and got.dtype == torch.long, (got.shape, want.shape)
    assert torch.equal(got.sort(dim=-1).values, want.sort(dim=-1).values), ("sets differ", bs, kb, got, want)
    for row in got:
        kept = row[row >= 0]
        assert torch.equal(row[:kept.numel()], kept), "-1 before a kept id"
        assert torch.equal(kept, kept.sort().values), "kept ids not ascending"


n = 0
for seed in range(2):
    for (s, vis, bs, kb), _ in _gen_blocks(None, "cpu", seed):
        check(s, vis, bs, kb)
        n += 1
g = torch.Generator().manual_seed(3)
s = torch.randn(5, 1000, generator=g).bfloat16().float()
vis = torch.tensor([1000, 0, 517, 8, 999])
s[torch.arange(1000)[None, :] >= vis[:, None]] = float("-inf")
t = torch.randn(3, 61, generator=g).round()  # exact ties between block maxima
tvis = torch.tensor([61, 30, 1])
t[torch.arange(61)[None, :] >= tvis[:, None]] = float("-inf")
for block, bits in ((8192, 4), (32, 4), (8192, 1)):  # 32: the select streams the block maxima in chunks
    tt.MAX_BLOCK, tt.RADIX_BITS = block, bits
    for x, v, bs, kb in ((s, vis, 8, 16), (s, vis, 8, 125), (s, vis, 8, 200), (s, vis, 16, 1), (t, tvis, 4, 5),
                         (t, tvis, 4, 64)):
        check(x, v, bs, kb)
        n += 1
print("INTERPRETED", n)
"""


def test_candidate_blocks_kernel_in_the_interpreter(run_interpreted):
    run_interpreted(_INTERPRETED, "INTERPRETED 24")
