"""Diagnostic (not a pytest file): the paired swap call at V4.1's widths under PDL, with and without the down
launch's early weight requests (``gluon_swap_pair.PAIR_EARLY_WEIGHTS``); with ``--router``, an RMSNorm and the
V4.1 router's GEMV ([384, 5120] fp32 weights, ``gemm.dense_wide``) with and without the GEMV's early L2 requests
(``triton_dense_gemv.EARLY_L2``).

    python -m deepinfer_nvidia.tests.probe_early_weights [--tokens 1] [--order 0,1,0,1,0,1] [--calls 8] [--router]

Each setting: ``--calls`` back-to-back calls in one CUDA graph (so each up launch follows a down launch and each
down launch an up launch, as in a decode step), replayed by ``graph_timing.graph_us`` (median), us a call; the
outputs are compared with the first setting's bit for bit. A whole decode step's rows move by 10-30 us between
readings; this isolates the one boundary the early requests change.
"""
from __future__ import annotations

import argparse
import itertools

import torch

from deepinfer_nvidia.tests.bench_swap import v41_cases
from deepinfer_nvidia.tests.graph_timing import graph_us


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="1")
    ap.add_argument("--order", default="0,1,0,1,0,1")
    ap.add_argument("--calls", type=int, default=8)
    ap.add_argument("--router", action="store_true", help="the router GEMV after an RMSNorm instead of the experts")
    args = ap.parse_args()
    if args.router:
        return _router(args)
    import deepinfer_nvidia.kernels.gluon_moe_swap as sw
    import deepinfer_nvidia.kernels.gluon_swap_pair as gp
    from deepinfer_nvidia.kernels.triton_pdl import pdl_launch

    print(f"PDL launch options: {pdl_launch()}", flush=True)
    for t, x, w, ids, ws in v41_cases(args.tokens):
        ref = None
        for v in [int(s) for s in args.order.split(",")]:
            gp.PAIR_EARLY_WEIGHTS = bool(v)
            out = sw.swap_mxfp4(x, w, ids, *ws, 10.0, paired=True)
            ref = out if ref is None else ref
            us = graph_us(lambda: sw.swap_mxfp4(x, w, ids, *ws, 10.0, paired=True), calls=args.calls, rep=200)
            print(f"[early T={t} early={v}] {us:.2f} us a call; bit-equal to the first: {torch.equal(out, ref)}",
                  flush=True)


def _router(args) -> None:
    """RMSNorm then the router GEMV, ``--calls`` pairs a graph, EARLY_L2 per ``--order``."""
    import deepinfer_nvidia.kernels.triton_dense_gemv as dg
    from deepinfer_nvidia.kernels.triton_norm import rms

    g = torch.Generator(device="cuda").manual_seed(1)
    D, E = 5120, 384
    # distinct weights a call, as the layers have: a replay cannot find the last call's weights in L2
    ws = [torch.randn(E, D, generator=g, device="cuda") * 0.02 for _ in range(args.calls)]
    nw = torch.rand(D, generator=g, device="cuda") + 0.5
    for t in [int(v) for v in args.tokens.split(",")]:
        x = torch.randn(t, D, generator=g, device="cuda").to(torch.bfloat16)
        it = itertools.count()

        def call():
            return dg.gemm_dense_wide(rms(x, nw, 1e-6), ws[next(it) % len(ws)])

        ref = None
        for v in [int(s) for s in args.order.split(",")]:
            dg.EARLY_L2 = bool(v)
            out = dg.gemm_dense_wide(rms(x, nw, 1e-6), ws[0])  # one fixed weight for the bit check
            ref = out if ref is None else ref
            us = graph_us(call, calls=args.calls, rep=200)
            print(f"[router T={t} early={v}] {us:.2f} us a norm + GEMV; bit-equal to the first: "
                  f"{torch.equal(out, ref)}", flush=True)


if __name__ == "__main__":
    main()
