"""``triton_align.align_small`` (one-launch routing layout of the MoE kernels) under Triton's CPU interpreter:
identical to the torch form of ``triton_moe.align`` (rows, sentinels, block owners) for random, skewed
(every pair on one expert, runs longer than a block) and single-pair routings, block sizes 16 and 128, and
batch 256's 1536 pairs."""
from __future__ import annotations

CODE = r'''
import torch
from deepinfer_nvidia.kernels import triton_align as ta
from deepinfer_nvidia.kernels import triton_moe as tm

g = torch.Generator().manual_seed(0)
cases = 0
for t, k, e in ((1, 6, 384), (1, 1, 8), (5, 6, 16), (64, 6, 384), (40, 3, 3), (170, 6, 256), (256, 6, 384)):
    if t == 256:  # batch 256: the largest sort (2048 keys), one routing and one block size
        ids = torch.rand(t, e, generator=g).topk(k, dim=1).indices
        nb = tm.num_blocks(t * k, e, 16)
        assert all(torch.equal(a, b) for a, b in zip(ta.align_small(ids, e, 16, nb), tm.align(ids, e, 16)))
        cases += 1
        continue
    for route in ("rand", "one"):
        if route == "rand":
            ids = torch.rand(t, e, generator=g).topk(k, dim=1).indices
        else:
            ids = torch.full((t, k), e - 1, dtype=torch.long)
        for bm in (16, 128):
            nb = tm.num_blocks(t * k, e, bm)
            ref = tm.align(ids, e, bm)  # CPU tensors: the torch form
            out = ta.align_small(ids, e, bm, nb)
            assert torch.equal(out[0], ref[0]), (t, k, e, route, bm, out[0], ref[0])
            assert torch.equal(out[1], ref[1]), (t, k, e, route, bm, out[1], ref[1])
            cases += 1
print("ALIGN_OK", cases)
'''


def test_align_small_equals_torch_form(run_interpreted):
    run_interpreted(CODE, "ALIGN_OK 25")
