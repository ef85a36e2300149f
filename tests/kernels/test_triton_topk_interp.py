"""``index.topk``'s Triton kernel (``deepinfer_nvidia/kernels/triton_topk.py``) against the reference in Triton's CPU
interpreter: the op's own cases, exact ties (rounded scores, +0.0 / -0.0), rows with fewer valid scores than k,
all-invalid rows, k = 1 and k >= N, bf16-rounded V4.1-sized rows (N 1000, k 512), the streamed path (rows
longer than one register block), 2^bits probes a counting pass (bits 4, 3, 2), and the bisection on int32 keys (the
default) and on int64 keys, with and without its early exit (rows of distinct scores, where a pass counts exactly
k; rows with at most k valid scores). The kept set must equal the reference's, in ascending position order, ``-1``
only after the kept positions."""
from __future__ import annotations


_INTERPRETED = r"""
import torch
from deepinfer_core.kernels.ops.indexer import _gen_topk, topk_positions
from deepinfer_nvidia.kernels import triton_topk as tt


def check(s, k):
    got, want = tt.topk_positions_triton(s, k, force_kernel=True), topk_positions(s, k)
    assert got.shape == want.shape and got.dtype == torch.long, (got.shape, want.shape)
    assert torch.equal(got.sort(dim=-1).values, want.sort(dim=-1).values), ("sets differ", k)
    for row in got:
        kept = row[row >= 0]
        assert torch.equal(row[:kept.numel()], kept), "-1 before a kept position"
        assert torch.equal(kept, kept.sort().values), "kept positions not ascending"


n = 0
for seed in range(2):
    for (s, k), _ in _gen_topk(None, "cpu", seed):
        check(s, k)
        n += 1
g = torch.Generator().manual_seed(5)
s = torch.randn(4, 300, generator=g).round()  # many exact ties
s[1, :] = 0.0
s[1, ::3] = -0.0
s[2, 100:] = float("-inf")
s[3, :] = float("-inf")
s2 = (torch.randn(3, 1000, generator=g) * 4).bfloat16().float()
s2[0, 500:] = float("-inf")
s3 = torch.randn(2, 2048, generator=g)  # distinct scores: the bisection stops at an exact count of k
s3[1, 1500:] = float("-inf")  # 1500 valid
# 64: rows streamed in chunks; 1: bisection, with its early exit (exact count, or all kept) and without. The
# default launch (8192, 1 bit, early exit) takes every case; the other launches the four that reach each of
# their branches (ties, k above the valid count, bf16 ties beside -inf, an exact count of k) to keep the
# interpreter's time down
ALL = ((s, 7), (s, 1), (s, 299), (s, 300), (s, 400), (s2, 512), (s2, 20), (s3, 512), (s3, 1500), (s3, 1499))
SOME = ((s, 7), (s, 400), (s2, 512), (s3, 1499))
# key32: the 1-bit search's int32 keys (the default) or the int64 keys with a valid mask
for block, bits, early, key32, cases in ((8192, 1, True, True, ALL), (8192, 4, True, True, SOME),
                                         (64, 4, True, True, SOME), (8192, 2, True, True, SOME),
                                         (8192, 1, False, True, SOME), (64, 1, True, True, SOME),
                                         (8192, 1, True, False, SOME), (64, 1, False, False, SOME),
                                         (8192, 3, True, True, SOME), (64, 2, False, False, SOME)):
    tt.MAX_BLOCK, tt.RADIX_BITS, tt.EARLY_EXIT, tt.KEY32 = block, bits, early, key32
    for x, k in cases:
        check(x, k)
        n += 1
print("INTERPRETED", n)
"""


def test_topk_kernel_in_the_interpreter(run_interpreted):
    run_interpreted(_INTERPRETED, "INTERPRETED 52")
