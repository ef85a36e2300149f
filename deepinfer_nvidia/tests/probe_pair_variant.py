"""Diagnostic (not a pytest file): a boolean module switch of the paired swap experts (``gluon_swap_pair``) off
against on, at V4.1's widths (384 experts) on the word layout the model uses.

    python -m deepinfer_nvidia.tests.probe_pair_variant --attr PAIR_ONE_BARRIER [--check 1,2,8] [--time 1,2]
                                                        [--order 0,1,0,1,0,1]

``--check``: the two forms must give the same output bit for bit (a switch that only reorders copies, waits and
barriers keeps the same decode and wgmma). ``--time``: us a call (8 back-to-back calls a CUDA graph, median of the
replays), alternated per ``--order``.
"""
from __future__ import annotations

import argparse

import torch

from deepinfer_nvidia.tests.bench_swap import v41_cases
from deepinfer_nvidia.tests.graph_timing import graph_us


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--attr", required=True)
    ap.add_argument("--check", default="1,2,8")
    ap.add_argument("--time", default="1,2")
    ap.add_argument("--order", default="0,1,0,1,0,1")
    args = ap.parse_args()
    import deepinfer_nvidia.kernels.gluon_moe_swap as sw
    import deepinfer_nvidia.kernels.gluon_swap_pair as gp
    from deepinfer_core.kernels.ops.mxfp4_words import pack_words

    if not isinstance(getattr(gp, args.attr, None), bool):
        raise SystemExit(f"gluon_swap_pair.{args.attr} is not a boolean switch")
    packed = None
    failures = 0
    for t, x, w, ids, ws in v41_cases(args.check):
        if packed is None:
            packed = list(ws)
            for i in (0, 2, 4):
                packed[i] = pack_words(ws[i])
        outs = []
        for v in (False, True):
            setattr(gp, args.attr, v)
            outs.append(sw.swap_mxfp4(x, w, ids, *packed, 10.0, packed=True))
        same = torch.equal(outs[0], outs[1])
        failures += not same
        print(f"[check T={t}] {args.attr} on bit-equal to off: {same}", flush=True)
    print(f"check: {failures} failures", flush=True)
    for t, x, w, ids, _ in v41_cases(args.time):
        for v in [int(s) for s in args.order.split(",")]:
            setattr(gp, args.attr, bool(v))
            us = graph_us(lambda: sw.swap_mxfp4(x, w, ids, *packed, 10.0, packed=True), calls=8, rep=200)
            print(f"[time T={t} {args.attr}={v}] {us:.2f} us a call", flush=True)


if __name__ == "__main__":
    main()
