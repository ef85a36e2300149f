"""A few eager launches of the decode hot spots, for Nsight Compute (device probe, written in the twentieth pass).

Batch 1's two largest costs run at a fraction of the bandwidth (the swap experts at ~1.4 TB/s, the wgmma FP8
GEMVs at 22-57%), and timing variants (TMA, ring depth, scales ahead, split-K) has not found the limit. This
script launches each of them a few times at V4.1 widths so ``ncu`` can read the warp stall reasons, issue
activity, occupancy and memory throughput of one launch:

    ncu --clock-control none --kernel-name regex:'_swap_kernel|_wgmma_gemv_kernel' --launch-skip 4 \
        --launch-count 6 --section SpeedOfLight --section Occupancy --section WarpStateStats \
        --section SchedulerStats --section MemoryWorkloadAnalysis --section LaunchStats \
        python3 -m deepinfer_nvidia.tests.ncu_targets --tokens 1

(``pass21.sh ncu`` runs it). Each target runs ``--warm`` times first (compiles, fills the caches the kernels
keep), then ``--reps`` times; ``--launch-skip`` should cover the warm launches.
"""
from __future__ import annotations

import argparse
import math

import torch


def _mxfp4_stack(e: int, n: int, k: int, g: torch.Generator):
    w = torch.randint(0, 256, (e, n, k // 2), generator=g, device="cuda", dtype=torch.uint8)
    b = round(math.log2(1.0 / (math.sqrt(k) * 2.3))) + 127
    s = torch.randint(b - 2, b + 2, (e, n, k // 32), generator=g, device="cuda", dtype=torch.uint8)
    return w, s.view(torch.float8_e8m0fnu)


def swap_target(tokens: int, experts: int = 384, d: int = 5120, f: int = 2304, topk: int = 6):
    """The routed experts of one V4.1 layer (MXFP4 w1 / w3 [E, F, D/2], w2 [E, D, F/2]) at ``tokens`` tokens."""
    from deepinfer_nvidia.kernels import gluon_moe_swap as sw

    g = torch.Generator(device="cuda").manual_seed(0)
    w1, s1 = _mxfp4_stack(experts, f, d, g)
    w3, s3 = _mxfp4_stack(experts, f, d, g)
    w2, s2 = _mxfp4_stack(experts, d, f, g)
    x = torch.randn(tokens, d, generator=g, device="cuda").bfloat16()
    ids = torch.stack([torch.randperm(experts, generator=g, device="cuda")[:topk] for _ in range(tokens)])
    w = torch.rand(tokens, topk, generator=g, device="cuda")
    return lambda: sw.swap_mxfp4(x, w, ids.int(), w1, s1, w3, s3, w2, s2, 10.0)


def gemv_target(rows: int, n: int, k: int):
    """One wgmma FP8 GEMV of [n, k] at ``rows`` rows with V4.1's 32x32 UE8M0 block scales."""
    from deepinfer_nvidia.kernels import gluon_fp8_gemv as gg

    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randint(0, 126, (n, k), generator=g, device="cuda", dtype=torch.uint8).view(torch.float8_e4m3fn)
    s = torch.randint(120, 126, (n // 32, k // 32), generator=g, device="cuda", dtype=torch.uint8)
    x = torch.randn(rows, k, generator=g, device="cuda").bfloat16()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return lambda: gg.gemv_wgmma(x, q, s, s.shape[1], 32, 32, sms)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=1)
    ap.add_argument("--gemv", default="32768x1280,1280x5120,5120x8192", help="NxK shapes (V4.1's wq_b, wq_a, wo_b)")
    ap.add_argument("--warm", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    targets = [("swap", swap_target(args.tokens))]
    if args.tokens <= 16:  # the wgmma GEMV serves up to 16 rows
        targets += [(f"gemv {s}", gemv_target(args.tokens, *map(int, s.split("x"))))
                     for s in args.gemv.split(",") if s]
    for name, fn in targets:
        for _ in range(args.warm + args.reps):
            fn()
        torch.cuda.synchronize()
        print(f"{name}: {args.warm} warm-up + {args.reps} launches", flush=True)


if __name__ == "__main__":
    main()
