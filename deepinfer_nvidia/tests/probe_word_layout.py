"""Diagnostic (not a pytest file): the swap experts on stacks repacked into the word layout
(``deepinfer_core.kernels.ops.mxfp4_words.pack_words``, 15 decode instructions a word instead of 19) against the checkpoint layout,
at V4.1's widths.

    python -m deepinfer_nvidia.tests.probe_word_layout [--check 1,2,4,8,32,128,512,2048] [--time 1,2,8,64]
                                                       [--order 0,1,0,1,0,1] [--calls 8]

``--check``: for each token count, ``swap_mxfp4`` on the repacked stacks (``packed=True``) must equal the call on
the checkpoint stacks bit for bit (the same bf16 weights reach the same wgmma; the counts span the paired kernel,
the one-warpgroup kernel with its split up launch, and its shared-memory A at 64-pair blocks), with the fast and
the exact two-multiply decode. ``--time``: us a call (``--calls`` back-to-back calls a CUDA graph, median of the
replays), layouts alternated per ``--order``.
"""
from __future__ import annotations

import argparse

import torch

from deepinfer_nvidia.tests.bench_swap import v41_cases
from deepinfer_nvidia.tests.graph_timing import graph_us


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", default="1,2,4,8,32,128,512,2048")
    ap.add_argument("--time", default="1,2,8,64")
    ap.add_argument("--order", default="0,1,0,1,0,1")
    ap.add_argument("--calls", type=int, default=8)
    args = ap.parse_args()
    import deepinfer_nvidia.kernels.gluon_moe_swap as sw
    from deepinfer_core.kernels.ops.mxfp4_words import pack_words, unpack_words

    packed = None
    failures = 0
    for t, x, w, ids, ws in v41_cases(args.check):
        if packed is None:
            packed = list(ws)
            for i in (0, 2, 4):  # w1, w3, w2; the scales stay as they are
                packed[i] = pack_words(ws[i])
                assert torch.equal(unpack_words(packed[i]), ws[i])
        for safe in (False, True):
            ref = sw.swap_mxfp4(x, w, ids, *ws, 10.0, safe=safe)
            out = sw.swap_mxfp4(x, w, ids, *packed, 10.0, safe=safe, packed=True)
            same = torch.equal(out, ref)
            failures += not same
            print(f"[check T={t} safe={int(safe)}] bit-equal: {same}", flush=True)
    print(f"check: {failures} failures", flush=True)
    for t, x, w, ids, ws in v41_cases(args.time):
        for v in [int(s) for s in args.order.split(",")]:
            stacks, flag = (packed, True) if v else (list(ws), False)
            us = graph_us(lambda: sw.swap_mxfp4(x, w, ids, *stacks, 10.0, packed=flag), calls=args.calls, rep=200)
            print(f"[time T={t} packed={v}] {us:.2f} us a call", flush=True)


if __name__ == "__main__":
    main()
