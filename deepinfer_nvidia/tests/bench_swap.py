"""Gluon swap-AB MXFP4 experts (``gluon_moe_swap``) on the GPU: parity, then timings (not a pytest file).

    python -m deepinfer_nvidia.tests.bench_swap [--out DIR] [--arch v41] [--tokens 1,8,64,256,1024]
        [--variants 16x64x128x4x3,...]   (block_m x block_n x block_k x warps x stages)

1. Parity against the ``aten`` provider (bf16 dequant + grouped GEMM) at full width, with realistic scale bytes
   (the one-multiply decode) and, at small widths, with random scale bytes over 0..200 (the exact two-multiply
   decode, subnormal and large scales included), for several tile shapes; max relative error printed; any
   error above 2e-2 (or a NaN) fails the run.
2. For each token count: the current default path of ``moe.experts_mxfp4`` (split-K / ``tl.dot_scaled``) and
   each swap variant, replayed from one CUDA graph per call (us per layer, mean of ``do_bench``), with the
   bytes of the distinct routed experts over the time as GB/s. Writes ``swap_bench.json``.
"""
from __future__ import annotations

import argparse
import json
import math
import os

import torch

from deepinfer_nvidia.tests.graph_timing import graph_us

_TIMING = {"warmup": 20, "rep": 100, "mode": "mean"}  # graph_us as this bench has always timed


def _packed(e, n, k, g, scale_lo=None, scale_hi=None):
    w = torch.randint(0, 256, (e, n, k // 2), generator=g, device="cuda", dtype=torch.uint8)
    if scale_lo is None:  # realistic: one power of two near 1/sqrt(k)
        b = round(math.log2(1.0 / (math.sqrt(k) * 2.3))) + 127
        s = torch.randint(b - 2, b + 2, (e, n, k // 32), generator=g, device="cuda", dtype=torch.uint8)
    else:
        s = torch.randint(scale_lo, scale_hi, (e, n, k // 32), generator=g, device="cuda", dtype=torch.uint8)
    return w, s.view(torch.float8_e8m0fnu)


def v41_cases(tokens: str, seed: int = 0):
    """V4.1's routed experts on the GPU (MXFP4 stacks of 384 experts, D 5120, F 2304: w1, w3, w2 with scales) and,
    for each token count of the comma-separated ``tokens``, random (t, x [t, D] bf16, weights [t, 6], ids [t, 6]):
    yields ``(t, x, w, ids, stacks)``. The probes' common case."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    e, k, d, f = 384, 6, 5120, 2304
    stacks = (*_packed(e, f, d, g), *_packed(e, f, d, g), *_packed(e, d, f, g))
    for t in [int(v) for v in tokens.split(",")]:
        x = torch.randn(t, d, generator=g, device="cuda").to(torch.bfloat16)
        ids = torch.rand(t, e, generator=g, device="cuda").topk(k, dim=1).indices
        w = torch.rand(t, k, generator=g, device="cuda")
        yield t, x, w, ids, stacks


def _rel(a, b):
    a, b = a.float(), b.float()
    if not torch.isfinite(a).all():
        return float("nan")
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def _profile_kernels(fn, tag: str, replays: int = 20) -> None:
    """GPU time of each kernel of ``fn`` replayed from one CUDA graph ``replays`` times (us a call)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    kernels = sorted((e for e in prof.events() if e.device_time_total > 0 and e.device_type.name == "CUDA"),
                     key=lambda e: e.time_range.start)
    per = len(kernels) // replays  # the graph's kernels in launch order, the same in every replay
    if per == 0:
        print(f"[profile {tag}] no kernels recorded")
        return
    us = [sum(kernels[r * per + i].device_time_total for r in range(replays)) / replays for i in range(per)]
    print(f"[profile {tag}] kernels {sum(us):.1f} us: " + ", ".join(
        f"{kernels[i].name[:32]} {us[i]:.1f}" for i in range(per)), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--arch", default="v41", choices=("v4", "v41"))
    ap.add_argument("--tokens", default="1,8,64,256,1024,8192")
    ap.add_argument("--variants", default="16x64x128x4x3x2,16x64x128x4x4x2,16x64x128x4x3x1,32x64x128x4x3x2,"
                    "64x64x128x4x3x2,128x64x128x4x2x0", help="block_m x block_n x block_k x warps x stages x areg")
    ap.add_argument("--probes", default="", help="diagnostics only: areg:probe:block_k:stages,... timed at "
                    "T=1 and 64 (probe bits: 1 no async-proxy fence, 2 no wgmma, 4 no decode; results wrong)")
    ap.add_argument("--splits", default="", help="split-K variants timed with the module's tiles: up/down K "
                    "splits (e.g. 3/2), autoN (the policy with SPLIT_UP=N) or fill (with SPLIT_FILL), each "
                    "optionally @R (the up kernel capped at R registers, e.g. 2/1@128); parity checked at full width")
    ap.add_argument("--profile", default="", help="token counts whose default call (split on and off) is "
                    "replayed under torch.profiler: per-kernel GPU times (align, permute, up, down, sum)")
    ap.add_argument("--tma", default="", help="stage counts timed with the weight tiles by TMA (module tiles "
                    "otherwise), e.g. 3,4,6; parity against aten checked; with --profile, also profiled")
    ap.add_argument("--down-pad", action="store_true", help="also time the module's tiles with "
                    "SWAP_DOWN_SKIP_PAD flipped (on: the down launch does not read h's padding rows); outputs must be "
                    "bit-equal")
    ap.add_argument("--scales-smem", action="store_true", help="also time the module's tiles with SWAP_SCALES_SMEM "
                    "flipped (on since the twenty-third pass: scale words staged in shared memory once); outputs must "
                    "be bit-equal")
    ap.add_argument("--pair", action="store_true", help="also time the swap with two warpgroups a program "
                    "(gluon_swap_pair) and with one, whatever the policy picks; parity against aten checked")
    ap.add_argument("--pair-stages", default="", help="with --pair, also the two-warpgroup launches at these ring "
                    "depths, e.g. 3,4 (gluon_swap_pair.PAIR_STAGES otherwise)")
    ap.add_argument("--skip-parity", action="store_true")
    args = ap.parse_args()
    import deepinfer_nvidia.kernels.gluon_moe_swap as sw
    import deepinfer_nvidia.kernels.gluon_swap_split as sp
    import deepinfer_nvidia.kernels.triton_moe as tm
    from deepinfer_nvidia.kernels import aten_ops

    g = torch.Generator(device="cuda").manual_seed(0)
    E, K, D, F = (384, 6, 5120, 2304) if args.arch == "v41" else (256, 6, 4096, 2048)
    variants = [tuple(int(v) for v in s.split("x")) for s in args.variants.split(",") if s]
    failures = []

    def inputs(t, e, d):
        x = torch.randn(t, d, generator=g, device="cuda").to(torch.bfloat16)
        ids = torch.rand(t, e, generator=g, device="cuda").topk(K, dim=1).indices
        return x, torch.rand(t, K, generator=g, device="cuda"), ids

    if args.probes:
        ws = (*_packed(E, F, D, g), *_packed(E, F, D, g), *_packed(E, D, F, g))
        for t in (1, 64):
            x, w, ids = inputs(t, E, D)
            ref = tm.moe_experts_mxfp4(x, w, ids, *ws, 10.0)
            base = graph_us(lambda: tm.moe_experts_mxfp4(x, w, ids, *ws, 10.0), **_TIMING)
            line = f"[probe] T={t:4d} default {base:8.1f}"
            for spec in args.probes.split(","):
                areg, probe, bk, st = (int(v) for v in spec.split(":"))
                fn = lambda: sw.swap_mxfp4(x, w, ids, *ws, 10.0, block_k=bk, stages=st, areg=areg,  # noqa: E731
                                           probe=probe)
                r = _rel(fn(), ref) if probe == 0 else float("nan")
                line += f" | {spec} {graph_us(fn, **_TIMING):8.1f}" + (f" (rel {r:.1e})" if probe == 0 else "")
            print(line, flush=True)
    for t in [int(v) for v in args.profile.split(",") if v]:
        ws = (*_packed(E, F, D, g), *_packed(E, F, D, g), *_packed(E, D, F, g))
        x, w, ids = inputs(t, E, D)
        for split in (None, (1, 1)):
            _profile_kernels(lambda: sw.swap_mxfp4(x, w, ids, *ws, 10.0, split=split), f"T={t} split={split}")
        if args.tma:
            _profile_kernels(lambda: sw.swap_mxfp4(x, w, ids, *ws, 10.0, tma=True), f"T={t} tma")
    # -- parity -------------------------------------------------------------------------------------
    small = (16, 256, 192)  # E, D, F: K tails of the 128/256 tiles, rows not multiples of the N tile
    for tag, (e, d, f), lo, hi in () if args.skip_parity else (("full", (E, D, F), None, None),
                                                              ("small-extreme", small, 0, 200)):
        ws = (*_packed(e, f, d, g, lo, hi), *_packed(e, f, d, g, lo, hi), *_packed(e, d, f, g, lo, hi))
        print(f"[parity {tag}] fast decode allowed: {sw.scales_allow_fast(ws[1], ws[3], ws[5])}")
        for t in (1, 5, 64, 300):
            x, w, ids = inputs(t, e, d)
            ref = aten_ops.moe_experts_mxfp4(x, w, ids, *ws, 10.0)
            for bm, bn, bk, nw, st, ar in variants[:5]:
                for safe in (True, False) if lo is None else (True,):
                    out = sw.swap_mxfp4(x, w, ids, *ws, 10.0, block_m=bm, block_n=bn, block_k=bk, warps=nw,
                                        stages=st, safe=safe, areg=ar)
                    r = _rel(out, ref)
                    ok = r == r and r <= 2e-2
                    if not ok:
                        failures.append((tag, t, bm, bn, bk, nw, st, ar, safe, r))
                    print(f"  T={t:4d} bm{bm} bn{bn} bk{bk} w{nw} s{st} areg{ar} safe={int(safe)}: rel {r:.2e}"
                          + ("" if ok else "  FAIL"))
    if failures:
        print("PARITY FAILURES:", failures)

    # -- timings ------------------------------------------------------------------------------------
    ws = (*_packed(E, F, D, g), *_packed(E, F, D, g), *_packed(E, D, F, g))
    per_expert = sum(a.numel() for a in ws)  # bytes (uint8 and e8m0 are one byte each)
    rows = []
    for t in [int(v) for v in args.tokens.split(",") if v]:
        x, w, ids = inputs(t, E, D)
        distinct = torch.unique(ids).numel()
        mb = distinct * per_expert / E / 1e6
        base = graph_us(lambda: tm.moe_experts_mxfp4(x, w, ids, *ws, 10.0), **_TIMING)
        own = graph_us(lambda: sw.swap_mxfp4(x, w, ids, *ws, 10.0), **_TIMING)  # the module's own tiles
        row = {"T": t, "pairs": t * K, "experts": distinct, "MB": round(mb, 1), "default_us": round(base, 1),
               "swap_own_us": round(own, 1), "swap": {}}
        line = (f"T={t:5d} pairs={t * K:6d} experts={distinct:3d} {mb:8.1f} MB  default {base:8.1f} us"
                f" ({mb / base:4.2f} TB/s) | swap own tiles {own:8.1f} ({mb / own:4.2f} TB/s)")
        for st in [int(v) for v in args.tma.split(",") if v]:
            fn = lambda: sw.swap_mxfp4(x, w, ids, *ws, 10.0, stages=st, tma=True)  # noqa: E731
            r = _rel(fn(), aten_ops.moe_experts_mxfp4(x, w, ids, *ws, 10.0))
            if not (r == r and r <= 2e-2):
                failures.append(("tma", t, st, r))
            us = graph_us(fn, **_TIMING)
            row["swap"][f"tma s{st}"] = round(us, 1)
            line += f" | tma s{st} {us:8.1f} (rel {r:.0e})"
        if args.pair:
            ref_out = aten_ops.moe_experts_mxfp4(x, w, ids, *ws, 10.0)
            runs = [("one warpgroup", {"paired": False}), ("two warpgroups", {"paired": True})]
            runs += [(f"two warpgroups s{v}", {"paired": True, "stages": int(v)})
                     for v in args.pair_stages.split(",") if v]
            for label, kw in runs:
                fn = lambda kw=kw: sw.swap_mxfp4(x, w, ids, *ws, 10.0, **kw)  # noqa: E731
                r = _rel(fn(), ref_out)
                if not (r == r and r <= 2e-2):
                    failures.append(("pair", t, label, r))
                us = graph_us(fn, **_TIMING)
                row["swap"][label] = round(us, 1)
                line += f" | {label} {us:8.1f} (rel {r:.0e})"
        # module switches timed against their other setting: (flag on, knob, tag, label when the knob is on / off)
        for wanted, knob, tag, label_on, label_off in (
                (args.down_pad, "SWAP_DOWN_SKIP_PAD", "down-pad", "down skips padding", "down reads padding"),
                (args.scales_smem, "SWAP_SCALES_SMEM", "scales-smem", "scales in smem", "scales from global")):
            if not wanted:
                continue
            saved_knob = getattr(sw, knob)
            value, label = not saved_knob, (label_off if saved_knob else label_on)
            other = sw.swap_mxfp4(x, w, ids, *ws, 10.0)  # the module's setting
            setattr(sw, knob, value)
            try:
                fn = lambda: sw.swap_mxfp4(x, w, ids, *ws, 10.0)  # noqa: E731
                same = torch.equal(fn(), other)
                if not same:
                    failures.append((tag, t))
                us = graph_us(fn, **_TIMING)
            finally:
                setattr(sw, knob, saved_knob)
            row["swap"][label] = round(us, 1)
            line += f" | {label} {us:8.1f} (bit-equal {same})"
        saved = (sp.SPLIT_UP, sp.SPLIT_FILL, sp.RESIDENT_UP)
        for spec in [v for v in args.splits.split(",") if v]:
            body, _, cap = spec.partition("@")  # "@128": the up kernel compiled with maxnreg 128
            maxnreg = int(cap) if cap else None
            if body.startswith("auto"):
                sp.SPLIT_UP, split = int(body[4:]), None
            elif body == "fill":  # the policy with SPLIT_FILL, 4 resident programs an SM under the cap, else 3
                sp.SPLIT_FILL, sp.RESIDENT_UP, split = True, 4 if maxnreg and maxnreg <= 128 else 3, None
            else:
                split = tuple(int(v) for v in body.split("/"))
            fn = lambda: sw.swap_mxfp4(x, w, ids, *ws, 10.0, split=split, maxnreg=maxnreg)  # noqa: E731
            out = fn()
            r = _rel(out, aten_ops.moe_experts_mxfp4(x, w, ids, *ws, 10.0))
            if not (r == r and r <= 2e-2):
                failures.append(("split", t, spec, r))
            # the register cap must not change a bit: same split without it
            same = "" if not maxnreg or split is None else \
                f", cap bit-equal {torch.equal(out, sw.swap_mxfp4(x, w, ids, *ws, 10.0, split=split))}"
            us = graph_us(fn, **_TIMING)
            sp.SPLIT_UP, sp.SPLIT_FILL, sp.RESIDENT_UP = saved
            row["swap"][f"split {spec}"] = round(us, 1)
            line += f" | split {spec} {us:8.1f} (rel {r:.0e}{same})"
        for bm, bn, bk, nw, st, ar in variants:
            if t * K >= 16384 and bm < 64 or t * K <= 64 and bm > 16:  # hopeless tiles at these sizes
                continue
            try:
                us = graph_us(lambda: sw.swap_mxfp4(x, w, ids, *ws, 10.0, block_m=bm, block_n=bn, block_k=bk,
                                                     warps=nw, stages=st, areg=ar), **_TIMING)
            except Exception as exc:  # a tile that does not fit: report and go on
                print(f"  {bm}x{bn}x{bk}x{nw}x{st}x{ar}: {type(exc).__name__}: {str(exc)[:200]}")
                continue
            row["swap"][f"{bm}x{bn}x{bk}x{nw}x{st}x{ar}"] = round(us, 1)
            line += f" | {bm}x{bn}x{bk}x{nw}x{st}x{ar} {us:8.1f}"
        rows.append(row)
        print(line, flush=True)
    # the pair range where the module's own swap tiles beat the default path (for DEEPINFER_NV_SWAP_PAIRS)
    if failures:
        print("FAILURES:", failures)
    wins = [r["pairs"] for r in rows if r["swap_own_us"] < r["default_us"]]
    print(f"swap wins at pairs: {wins}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "swap_pairs.txt"), "w") as fh:
        fh.write(f"{min(wins)},{max(wins)}\n" if wins else "0,0\n")
    with open(os.path.join(args.out, "swap_bench.json"), "w") as fh:
        json.dump({"arch": args.arch, "rows": rows, "parity_failures": [list(map(str, f)) for f in failures]},
                  fh, indent=1)


if __name__ == "__main__":
    main()
