"""``index.candidate_mask``'s Triton path (``triton_candidate_mask``: a -inf fill, then one program per row and 128
listed blocks copying their scores) against the reference in Triton's CPU interpreter. Cases: the op's own; V4.1's
block of 8 with 2048 listed blocks over rows of 1000 and 20000 scores; ids of -1, past the last block and repeated;
ids in any order; N not a multiple of the block; a row with nothing listed; NaN scores kept where listed; bf16 scores.
The result must equal the reference's bit for bit (NaN where NaN). Without a GPU and without ``force_kernel`` the
op hands off to the reference, and the registry lists the kernel as batch-invariant."""
from __future__ import annotations

import torch

_INTERPRETED = r"""
import torch
from deepinfer_core.kernels.ops.candidates import _gen_mask, candidate_mask
from deepinfer_nvidia.kernels import triton_candidate_mask as tcm


def check(s, blocks, bs):
    got, want = tcm.candidate_mask_triton(s, blocks, bs, force_kernel=True), candidate_mask(s, blocks, bs)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    assert torch.equal(got.isnan(), want.isnan()), "NaN positions differ"
    assert torch.equal(got.nan_to_num(0.0), want.nan_to_num(0.0)), ("values differ", bs, got, want)


n = 0
for seed in range(2):
    for (s, blocks, bs), _ in _gen_mask(None, "cpu", seed):
        check(s, blocks, bs)
        n += 1
g = torch.Generator().manual_seed(5)
for t, cols, bs, k in ((3, 1000, 8, 2048), (2, 20000, 8, 2048), (4, 61, 4, 5), (2, 130, 16, 200)):
    s = torch.randn(t, cols, generator=g)
    nb = -(-cols // bs)
    blocks = torch.randint(-1, nb + 3, (t, k), generator=g)  # -1, past the last block, repeats, any order
    blocks[-1] = -1  # a row with nothing listed
    s[0, :3] = float("nan")  # NaN: kept where listed, -inf elsewhere
    blocks[0, 0] = 0
    check(s, blocks, bs)
    check(s.bfloat16(), blocks, bs)
    n += 2
print("INTERPRETED", n)
"""


def test_candidate_mask_kernel_in_the_interpreter(run_interpreted):
    run_interpreted(_INTERPRETED, "INTERPRETED 12")


def test_candidate_mask_hands_off_without_a_gpu_and_is_registered():
    from deepinfer_core.kernels.ops.candidates import candidate_mask
    from deepinfer_nvidia.kernels import IMPLS
    from deepinfer_nvidia.kernels import triton_candidate_mask as tcm

    s = torch.randn(2, 20)
    blocks = torch.tensor([[0, 3], [-1, 1]])
    assert not tcm.supports_candidate_mask(s, blocks, 4)
    assert torch.equal(tcm.candidate_mask_triton(s, blocks, 4), candidate_mask(s, blocks, 4))
    rows = [row for row in IMPLS if row[0] == "index.candidate_mask"]
    assert rows == [("index.candidate_mask", "triton", "deepinfer_nvidia.kernels.triton_candidate_mask:candidate_mask_triton",
                     "deepinfer_nvidia.kernels.triton_candidate_mask:supports_candidate_mask", True)]
