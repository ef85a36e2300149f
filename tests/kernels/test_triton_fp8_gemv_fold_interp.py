"""The FP8 GEMV's folded split-K sum (``triton_fp8_gemv``, ``fold=1``) under Triton's CPU interpreter: the last
program of each column tile sums the partials in split order, so the result must equal the two-launch form
(``fold=0``, ``sum_slices``) bit for bit, match the reference, and leave every arrival counter at zero (the
next launch, or graph replay, starts clean)."""
from __future__ import annotations

CODE = r'''
import torch
from deepinfer_core.kernels.ops.gemm import fp8_block
from deepinfer_core.kernels.ops.quant import quant_fp8_block
from deepinfer_nvidia.kernels import triton_fp8_gemv as gv

g = torch.Generator().manual_seed(0)
for m, n, k, block in ((1, 96, 1024, (32, 32)), (2, 64, 2048, (128, 128))):
    x = torch.randn(m, k, generator=g)
    q, s = quant_fp8_block(torch.randn(n, k, generator=g) / k ** 0.5, block, "ue8m0")
    ref = fp8_block(x, q, s, block)
    sb = s.view(torch.uint8).contiguous()
    # 64 "SMs" x 64 programs each: split-K of 2 (k 1024) and 4 (k 2048); fold run twice (counters reset)
    outs = [gv.gemm_fp8_gemv(x, q, sb, s.shape[1], block[0], block[1], True, 64, programs=64, fold=f, block_k=256)
            for f in (0, 1, 1)]
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[1], outs[2]), (outs[0] - outs[1]).abs().max()
    assert (outs[1] - ref).abs().max() < 1e-4, (outs[1] - ref).abs().max()
    assert int(gv._counters(x.device, 1).abs().sum()) == 0
print("GEMV_FOLD_OK")
'''


def test_folded_split_k_sum_matches_two_launches(run_interpreted):
    run_interpreted(CODE, "GEMV_FOLD_OK")
