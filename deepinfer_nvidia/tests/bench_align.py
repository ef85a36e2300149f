"""``triton_moe.align`` forms on the GPU at decode sizes (fourteenth pass; not a pytest file).

    python3 -m deepinfer_nvidia.tests.bench_align [--out DIR]

For 1, 8, 64, 170 and 256 tokens x 6 slots over 384 experts (block 16): the one-launch sort kernel
(``align_small``) and the torch form, each checked equal to the torch form on the CPU, then timed as 20
calls captured in one CUDA graph (launch overhead excluded): microseconds per call, median of ``do_bench``.
Writes ``align.json``. (``docs/perf/pass14b/align.json`` also has the O(P^2) comparison kernel this
replaced, timed the same way.)
"""
from __future__ import annotations

import argparse
import json
import os

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    from triton.testing import do_bench

    from deepinfer_nvidia.kernels import triton_align as ta
    from deepinfer_nvidia.kernels import triton_moe as tm

    e, k, bm, calls = 384, 6, 16, 20
    g = torch.Generator().manual_seed(0)
    rows = []
    for t in (1, 8, 64, 170, 256):
        ids_cpu = torch.rand(t, e, generator=g).topk(k, dim=1).indices
        ids = ids_cpu.cuda()
        p, nb = t * k, tm.num_blocks(t * k, e, bm)
        ref = tm.align(ids_cpu, e, bm)
        forms = {"sort": lambda: ta.align_small(ids, e, bm, nb), "torch": lambda: _torch_form(tm, ids, e, bm)}
        row = {"tokens": t, "pairs": p}
        for name, fn in forms.items():
            out = fn()
            torch.cuda.synchronize()
            same = torch.equal(out[0].cpu(), ref[0]) and torch.equal(out[1].cpu(), ref[1])
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(calls):
                    fn()
            us = do_bench(graph.replay, warmup=10, rep=100, return_mode="median") * 1e3 / calls
            row[name] = {"us": round(us, 2), "equal": same}
        rows.append(row)
        print(row, flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "align.json"), "w") as fh:
        json.dump(rows, fh, indent=1)


def _torch_form(tm, ids, e, bm):
    """The torch form on the device (``align`` itself dispatches small routings to a kernel)."""
    saved = tm._align.ALIGN_MAX_PAIRS
    tm._align.ALIGN_MAX_PAIRS = 0
    try:
        return tm.align(ids, e, bm)
    finally:
        tm._align.ALIGN_MAX_PAIRS = saved


if __name__ == "__main__":
    main()
