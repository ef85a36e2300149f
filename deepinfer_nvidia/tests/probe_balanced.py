"""Diagnostic (not a pytest file): the paired swap experts' up launch spread evenly over two programs an SM
(``gluon_swap_balanced``) against the unbalanced launch, at V4.1's widths (384 experts) on the word layout the model
uses, one token.

    python -m deepinfer_nvidia.tests.probe_balanced [--order 0,1,0,1,0,1] [--calls 8] [--tokens 1]

For each reading: us a call of ``swap_mxfp4`` (``--calls`` back-to-back calls a CUDA graph, median of the replays),
and once per token count the largest difference between the two launches' outputs relative to the largest output
(the fp32 sums differ in order only). Predicted (docs/performance.md, forty-first pass): the up launch's busiest SMs
go from 40 to 34 steps, so up to -15% of the up launch (~-5 us a call on an H100, 56.7 us now).
"""
from __future__ import annotations

import argparse

import torch

from deepinfer_nvidia.tests.bench_swap import v41_cases
from deepinfer_nvidia.tests.graph_timing import graph_us


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--order", default="0,1,0,1,0,1")
    ap.add_argument("--calls", type=int, default=8)
    ap.add_argument("--tokens", default="1")
    args = ap.parse_args()
    import deepinfer_nvidia.kernels.gluon_moe_swap as sw
    import deepinfer_nvidia.kernels.gluon_swap_balanced as gb
    from deepinfer_core.kernels.ops.mxfp4_words import pack_words

    packed = None
    for t, x, w, ids, ws in v41_cases(args.tokens):
        if packed is None:
            packed = list(ws)
            for i in (0, 2, 4):
                packed[i] = pack_words(ws[i])
        outs = []
        for v in (0, 1):
            gb.BALANCED = bool(v)
            outs.append(sw.swap_mxfp4(x, w, ids, *packed, 10.0, packed=True).float())
        rel = ((outs[1] - outs[0]).abs().max() / outs[0].abs().max()).item()
        print(f"[check T={t}] balanced vs unbalanced: max rel diff {rel:.2e}, finite {bool(outs[1].isfinite().all())}",
              flush=True)
        for v in [int(s) for s in args.order.split(",")]:
            gb.BALANCED = bool(v)
            us = graph_us(lambda: sw.swap_mxfp4(x, w, ids, *packed, 10.0, packed=True), calls=args.calls, rep=200)
            print(f"[time T={t} balanced={v}] {us:.2f} us a call", flush=True)


if __name__ == "__main__":
    main()
