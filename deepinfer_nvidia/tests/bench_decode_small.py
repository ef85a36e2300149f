"""Launch shapes of two batch-1 kernels that carry little data but take ~10-16 us a call (not a pytest file).

    python3 -m deepinfer_nvidia.tests.bench_decode_small [--out DIR] [--only attn,mix,scores,engram,topk,route] \\
        [--tokens 1,2,8]

In the 8-layer V4.1 batch-1 step (docs/perf/pass22a/v41/profile.txt) ``attention.sparse_sink`` takes 15.6 us a call
for ~0.7 MB of KV rows (0.16 us at the copy bandwidth) and ``mhc.mix`` 10.6 us (projection 5.4 + gate 5.2) for a
1.5 MB matrix. Both are latency-bound, so their launch shapes decide their time. This times each launch shape:

- attention at V4.1 widths (64 heads of 512, bf16) over a 128-slot window plus 512 selected compressed rows (the
  indexed layers), 32 (the 128x-compressed layers) or none: heads per program, slots per chunk, K splits, warps;
- ``mhc.mix`` (residual [T, 4, 4096] bf16, fn [24, 16384] fp32): K splits, pipeline stages, gate warps;
- ``index.scores`` (64 heads of 128 over 1024 candidates): candidates a chunk and chunks a program;
- ``engram.gate`` (4 streams of 4096): one program a stream or one a token;
- ``index.topk`` (k 512 of 1024-8192 scores): keys of 32 or 64 bits, bits a pass, warps a program;
- ``moe.route_topk`` (384 experts, k 6): warps a program.

Each time is one CUDA-graph replay of ``RING`` back-to-back calls divided by ``RING`` (``graph_timing.graph_us``;
programmatic dependent launch as the step uses it), so the per-graph launch cost is spread as in a graphed step.
Each variant's output is compared with the default launch's (max abs difference printed). Writes
``decode_small.json``.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os

import torch

from deepinfer_nvidia.tests.graph_timing import graph_us

RING = 20


def bench_attention(tokens, rows) -> None:
    from deepinfer_nvidia.kernels import triton_attention as ta

    dev, bf = "cuda", torch.bfloat16
    h, d = 64, 512
    g = torch.Generator(device=dev).manual_seed(0)
    for t, (na, nb) in itertools.product(tokens, [(128, 512), (128, 32), (128, 0)]):
        sa, sb = 4096, 4096
        q = torch.randn(t, h, d, device=dev, dtype=bf, generator=g)
        kva = torch.randn(sa, d, device=dev, dtype=bf, generator=g)
        kvb = torch.randn(sb, d, device=dev, dtype=bf, generator=g)
        ia = torch.randint(0, sa, (t, na), device=dev, generator=g)
        ib = torch.randint(0, sb, (t, nb), device=dev, generator=g) if nb else None
        sinks = torch.randn(h, device=dev, generator=g)
        args = (q, kva, ia, kvb if nb else None, ib, sinks, d ** -0.5)
        base = ta.sparse_sink(*args)
        variants = [{}]
        for bh, bn, sp, w in itertools.product((16, 64), (16, 32), (1, 4, 8, 16, 32), (4, 8)):
            variants.append(dict(block_h=bh, block_n=bn, splits=sp, warps=w))
        for v in variants:
            try:
                out = ta.sparse_sink(*args, **v)
                err = (out.float() - base.float()).abs().max().item()
                us = graph_us(lambda: ta.sparse_sink(*args, **v), calls=RING)
            except Exception as e:  # a shape that does not compile (shared memory): reported, not fatal
                print(f"attn T={t} Na={na} Nb={nb} {v}: {type(e).__name__} {str(e)[:80]}", flush=True)
                continue
            rows.append(dict(kind="attn", t=t, na=na, nb=nb, variant=v, us=us, err=err))
            print(f"attn T={t} Na={na} Nb={nb:4d} {str(v or 'default'):62s} {us:7.2f} us  err {err:.2e}", flush=True)


def bench_mix(tokens, rows) -> None:
    from deepinfer_nvidia.kernels import triton_mhc as tm

    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(1)
    fn = torch.randn(24, 16384, device=dev, generator=g) / 128
    base = torch.randn(24, device=dev, generator=g)
    scale = torch.rand(3, device=dev, generator=g) + 0.5
    for t in tokens:
        r = torch.randn(t, 4, 4096, device=dev, dtype=torch.bfloat16, generator=g)
        args = (r, fn, base, scale, 1e-6, 1e-6, 20)
        ref = tm.mix(*args)
        variants = [{}] + [dict(splits=s, stages=st, gate_warps=gw)
                           for s, st, gw in itertools.product((16, 32, 64, 128), (2, 3), (1, 2, 4))]
        for v in variants:
            out = tm.mix(*args, decode_launch=v)
            err = max((a - b).abs().max().item() for a, b in zip(out, ref))
            us = graph_us(lambda: tm.mix(*args, decode_launch=v), calls=RING)
            rows.append(dict(kind="mix", t=t, variant=v, us=us, err=err))
            print(f"mix  T={t} {str(v or 'default'):52s} {us:7.2f} us  err {err:.2e}", flush=True)


def bench_scores(tokens, rows) -> None:
    """``index.scores`` at V4.1's indexer widths (64 heads of 128, bf16) over 1024 candidates (a 4k context)."""
    from deepinfer_nvidia.kernels import triton_indexer as ti

    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(2)
    h, d, n, slots = 64, 128, 1024, 8192
    for t in tokens:
        q = torch.randn(t, h, d, device=dev, dtype=torch.bfloat16, generator=g)
        w = torch.randn(t, h, device=dev, generator=g)
        keys = torch.randn(slots, d, device=dev, dtype=torch.bfloat16, generator=g)
        cand = torch.randint(0, slots, (t, n), device=dev, generator=g)
        base = ti.scores(q, w, keys, cand, d ** -0.5, launch=(64, 4))
        for v in [None, (64, 4), (64, 1), (32, 1), (16, 1), (32, 2)]:
            out = ti.scores(q, w, keys, cand, d ** -0.5, launch=v)
            err = (out - base).abs().max().item()
            us = graph_us(lambda: ti.scores(q, w, keys, cand, d ** -0.5, launch=v), calls=RING)
            rows.append(dict(kind="scores", t=t, variant={"launch": v} if v else {}, us=us, err=err))
            print(f"scores T={t} N={n} {str(v or 'default'):20s} {us:7.2f} us  err {err:.2e}", flush=True)


def bench_engram(tokens, rows) -> None:
    """``engram.gate`` at V4.1's widths (4 streams of 4096, bf16), one program a stream against one a token."""
    from deepinfer_nvidia.kernels import triton_engram as te

    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(3)
    n, d = 4, 4096
    qw = 1 + 0.1 * torch.randn(n, d, device=dev, generator=g)
    kw = 1 + 0.1 * torch.randn(n, d, device=dev, generator=g)
    for t in tokens:
        r = torch.randn(t, n, d, device=dev, dtype=torch.bfloat16, generator=g)
        kv = torch.randn(t, (n + 1) * d, device=dev, dtype=torch.bfloat16, generator=g)
        keep = te.STREAM_PROGRAMS
        outs = {}
        for per_stream in (True, False):
            te.STREAM_PROGRAMS = per_stream
            try:
                outs[per_stream] = te.gate(r, kv, qw, kw, 1e-6, 1e-6)
                us = graph_us(lambda: te.gate(r, kv, qw, kw, 1e-6, 1e-6), calls=RING)
            finally:
                te.STREAM_PROGRAMS = keep
            v = {} if per_stream == keep else {"stream_programs": per_stream}
            rows.append(dict(kind="engram", t=t, variant=v, us=us, err=0.0))
            print(f"engram T={t} one program a {'stream' if per_stream else 'token':6s} {us:7.2f} us", flush=True)
        print(f"engram T={t} bit-equal: {torch.equal(outs[True], outs[False])}", flush=True)


def bench_topk(tokens, rows) -> None:
    """``index.topk`` (k 512) over 1024-8192 scores (randn, and bf16-rounded: more ties), by search: int64 keys with
    a mask (the forty-second pass's) or int32 keys (``KEY32``), and 1, 2 or 3 bits a counting pass (2^bits probes
    each), at the default warps and the other of 4 / 8. Every variant's positions must equal the default's."""
    from deepinfer_nvidia.kernels import triton_topk as tk

    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(4)
    key32 = tk.KEY32
    for t in tokens:
        for n, dist in itertools.product((1024, 2048, 4096, 8192), ("randn", "bf16")):
            s = torch.randn(t, n, device=dev, generator=g) * 3
            if dist == "bf16":
                s = s.bfloat16().float()
            tk.KEY32 = key32
            base = tk.topk_positions_triton(s, 512)
            dw = 8 if n >= 4096 else 4
            for k32, bits, w in itertools.product((False, True), (1, 2, 3), (None, 12 - dw)):
                tk.KEY32 = k32
                out = tk.topk_positions_triton(s, 512, warps=w, bits=bits)
                same = bool(torch.equal(out, base))
                us = graph_us(lambda: tk.topk_positions_triton(s, 512, warps=w, bits=bits), calls=RING)
                v = {"key32": k32, "bits": bits, **({"warps": w} if w else {})}
                if k32 == key32 and bits == 1 and not w:
                    v = {}  # the default launch
                rows.append(dict(kind="topk", t=t, na=n, nb=dist, variant=v, us=us, err=float(not same)))
                print(f"topk T={t} N={n} {dist:5s} key32 {int(k32)} bits {bits} warps {str(w or dw):3s} {us:7.2f} us"
                      f"  equal {same}", flush=True)
    tk.KEY32 = key32


def bench_route(tokens, rows) -> None:
    """``moe.route_topk`` (V4.1: 384 experts, k 6, fp32 logits), by warps a program (the default: 4 at E 384);
    weights and ids must be bit-equal to the default launch's."""
    from deepinfer_nvidia.kernels import triton_route as tr

    g = torch.Generator(device="cuda").manual_seed(6)
    bias = torch.randn(384, device="cuda", generator=g) * 0.1
    for t in tokens:
        x = torch.randn(t, 384, device="cuda", generator=g) * 2
        base = tr.route_topk(x, bias, 6, 2.5)
        for w in (None, 1, 2, 4, 8):
            out = tr.route_topk(x, bias, 6, 2.5, warps=w)
            same = all(bool(torch.equal(a, b)) for a, b in zip(out, base))
            us = graph_us(lambda: tr.route_topk(x, bias, 6, 2.5, warps=w), calls=RING)
            rows.append(dict(kind="route", t=t, variant={"warps": w} if w else {}, us=us, err=float(not same)))
            print(f"route T={t} warps {str(w or 'default'):8s} {us:7.2f} us  equal {same}", flush=True)
        for k in (1, 2):  # what the k rounds of arg-max cost: a 1- and a 2-round launch against the 6 above
            us = graph_us(lambda: tr.route_topk(x, bias, k, 2.5), calls=RING)
            print(f"route T={t} k {k} (informational) {us:7.2f} us", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--only", default="attn,mix")
    ap.add_argument("--tokens", default="1,2,8")
    args = ap.parse_args()
    tokens = [int(x) for x in args.tokens.split(",") if x]
    rows: list[dict] = []
    only = set(args.only.split(","))
    if "mix" in only:
        bench_mix(tokens, rows)
    if "attn" in only:
        bench_attention(tokens, rows)
    if "scores" in only:
        bench_scores(tokens, rows)
    if "engram" in only:
        bench_engram(tokens, rows)
    if "topk" in only:
        bench_topk(tokens, rows)
    if "route" in only:
        bench_route(tokens, rows)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "decode_small.json"), "w") as f:
        json.dump(rows, f, indent=1)
    for kind in ("attn", "mix", "scores", "engram", "topk", "route"):  # the fastest variant per shape against the default
        for key in sorted({(r["t"], r.get("na"), r.get("nb")) for r in rows if r["kind"] == kind}):
            sel = [r for r in rows if r["kind"] == kind and (r["t"], r.get("na"), r.get("nb")) == key]
            best = min(sel, key=lambda r: r["us"])
            dflt = next(r for r in sel if not r["variant"])
            print(f"best {kind} {key}: {best['variant']} {best['us']:.2f} us against default {dflt['us']:.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
