"""Diagnostic (not a pytest file): ``index.topk``'s select at batch 1 by bisection and by four 8-bit histograms.

    python -m deepinfer_nvidia.tests.probe_topk_select [--sizes 1024,2048,4096,8192] [--k 512] [--warps 0,4,8]

For each row length N (k 512, the V4.1 indexer's; random fp32 scores, some rows bf16-rounded for ties) and each
warp count (0: the launcher's choice), one CUDA-graph replay of ``topk_positions_triton`` timed by
``triton.testing.do_bench`` (median us) with ``HIST_SELECT`` off, then on, then off, then on; each output's
set compared with the reference's (``index.topk``'s stable sort on the CPU).
"""
from __future__ import annotations

import argparse

import torch
from triton.testing import do_bench


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1024,2048,4096,8192")
    ap.add_argument("--k", type=int, default=512)
    ap.add_argument("--warps", default="0")
    args = ap.parse_args()
    from deepinfer_core.kernels.ops.indexer import topk_positions
    from deepinfer_nvidia.kernels import triton_topk as tt

    g = torch.Generator(device="cuda").manual_seed(0)
    for n in [int(v) for v in args.sizes.split(",")]:
        for rounded in (False, True):
            s = torch.randn(1, n, generator=g, device="cuda")
            s = s.bfloat16().float() if rounded else s
            want = topk_positions(s.cpu(), args.k).sort(dim=-1).values
            for warps in [int(v) for v in args.warps.split(",")]:
                line = []
                for hist in (0, 1, 0, 1):
                    tt.HIST_SELECT = bool(hist)
                    fn = lambda: tt.topk_positions_triton(s, args.k, warps=warps or None)  # noqa: E731
                    same = torch.equal(fn().cpu().sort(dim=-1).values, want)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        fn()
                    us = do_bench(graph.replay, warmup=20, rep=100, return_mode="median") * 1e3
                    line.append(f"{'hist' if hist else 'bisect'} {us:6.1f} us{'' if same else ' WRONG SET'}")
                print(f"N={n} k={args.k} {'bf16' if rounded else 'fp32'} warps={warps or 'auto'}: "
                      + " | ".join(line), flush=True)


if __name__ == "__main__":
    main()
