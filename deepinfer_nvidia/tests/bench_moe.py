"""Routed-expert (``moe.experts_mxfp4``) micro-benchmark at DeepSeek-V4-Flash widths (GPU; not a pytest file).

    python -m deepinfer_nvidia.tests.bench_moe [--out DIR] [--tokens 1,8,64,512,1024,8192] [--arch v41]

256 experts, top-6, D=4096, F=2048 (``--arch v41``: 384 experts, D=5120, F=2304), MXFP4 weights (random
codes, one power-of-two scale);
uniform random routing. For each token count: the grouped kernel with each ``TUNE`` variant
(eager, median of ``do_bench``), the dequantise-once path (large T), the previous per-expert
path (small T), and the grouped path replayed from a CUDA graph (launch overhead removed).
Bytes = native bytes of the distinct routed experts. Up to ``--splitk-max-pairs`` pairs the split-K
decode path (``triton_moe_splitk``) is timed too, each ``--splitk-variants`` entry replayed from a CUDA graph
next to the grouped path's graph; the largest pair count below which split-K wins everywhere becomes
``splitk_pairs``. A full-width parity check against the
``aten`` provider (bf16 dequant + grouped GEMM) runs first. Writes ``moe_bench.json`` and
``moe_tune.json`` (the fastest variant per BLOCK_M and the chosen ``DEQUANT_PAIRS``), which
``benchmarks/sweep.py --moe-tune`` applies.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--tokens", default="1,8,64,512,1024,8192")
    ap.add_argument("--per-expert", action="store_true", help="also time the earlier per-expert path (T <= 64)")
    ap.add_argument("--variants", default="64x4x3x0,64x4x3x1,128x8x3x0,128x8x3x1",
                    help="block_n x warps x stages x int_decode")
    ap.add_argument("--arch", default="v4", choices=("v4", "v41"))
    ap.add_argument("--splitk-variants", default="16x8x4x3x2048x1,32x8x8x3x2048x1,32x8x8x3x2048x0,"
                    "64x4x8x3x2048x1,32x8x8x3x512x1,32x4x4x3x2048x1",
                    help="block_n x groups x warps x stages x programs x asm")
    ap.add_argument("--splitk-max-pairs", type=int, default=4096)
    ap.add_argument("--seg-r", default="2,4", help="pairs per program of the segment path (triton_moe_segments)")
    ap.add_argument("--scaled-variants", default="16x64x256x4x3,16x128x256x4x3,16x64x128x4x4,32x64x256x4x3,"
                    "64x128x128x8x3,128x128x128x8x3,128x256x128x8x3,128x128x64x4x4",
                    help="tl.dot_scaled path (triton_moe_scaled): block_m x block_n x block_k x warps x stages")
    args = ap.parse_args()
    from triton.testing import do_bench

    import deepinfer_nvidia.kernels.triton_moe as tm
    import deepinfer_nvidia.kernels.triton_moe_splitk as sk
    from deepinfer_nvidia.graphs import CudaGraphRunner
    from deepinfer_nvidia.kernels import aten_ops
    from deepinfer_nvidia.kernels.triton_gemm import gemm_mxfp4

    dev, bf = "cuda", torch.bfloat16
    E, K, D, F = (384, 6, 5120, 2304) if args.arch == "v41" else (256, 6, 4096, 2048)
    g = torch.Generator(device=dev).manual_seed(0)

    def packed(n, k):
        w = torch.randint(0, 256, (E, n, k // 2), generator=g, device=dev, dtype=torch.uint8)
        e = round(math.log2(1.0 / (math.sqrt(k) * 2.3)))
        return w, torch.full((E, n, k // 32), e + 127, device=dev, dtype=torch.uint8).view(torch.float8_e8m0fnu)

    w1, s1 = packed(F, D)
    w3, s3 = packed(F, D)
    w2, s2 = packed(D, F)
    ws = (w1, s1, w3, s3, w2, s2)
    per_expert_bytes = sum(t[0].numel() * t.element_size() for t in ws)

    def inputs(t):
        x = torch.randn(t, D, generator=g, device=dev).to(bf)
        ids = torch.rand(t, E, generator=g, device=dev).topk(K, dim=1).indices
        w = torch.rand(t, K, generator=g, device=dev)
        return x, w, ids

    # parity at full width against the aten provider (dequantised bf16 experts, CUTLASS grouped GEMM)
    for t in (5, 64):
        x, w, ids = inputs(t)
        ref = aten_ops.moe_experts_mxfp4(x, w, ids, *ws, 10.0).float()
        for ni in (0, 1):
            out = tm.grouped_mxfp4(x, w, ids, *ws, 10.0, int_decode=ni).float()
            rel = float((out - ref).norm() / ref.norm())
            print(f"parity T={t}: grouped (int_decode={ni}) vs aten rel {rel:.2e}", flush=True)
            assert rel < 1e-2, rel
    for t in (1, 8, 64):
        x, w, ids = inputs(t)
        ref = aten_ops.moe_experts_mxfp4(x, w, ids, *ws, 10.0).float()
        for prog, am in ((None, None), (1 << 20, 1), (None, 0)):
            out = sk.splitk_mxfp4(x, w, ids, *ws, 10.0, programs=prog, asm=am).float()
            rel = float((out - ref).norm() / ref.norm())
            print(f"parity T={t}: split-K (programs={prog}, asm={am}) vs aten rel {rel:.2e}", flush=True)
            assert rel < 1e-2, rel
    from deepinfer_nvidia.kernels import triton_moe_segments as sg

    seg_rs = [int(v) for v in args.seg_r.split(",") if v]
    for t in (8, 64):
        x, w, ids = inputs(t)
        ref = aten_ops.moe_experts_mxfp4(x, w, ids, *ws, 10.0).float()
        for r in seg_rs:
            out = sg.segments_mxfp4(x, w, ids, *ws, 10.0, pairs_per_program=r).float()
            rel = float((out - ref).norm() / ref.norm())
            print(f"parity T={t}: segments (R={r}) vs aten rel {rel:.2e}", flush=True)
            assert rel < 1e-2, rel
    from deepinfer_nvidia.kernels import triton_moe_scaled as msc

    scv = [tuple(int(v) for v in s.split("x")) for s in args.scaled_variants.split(",") if s]
    for t in (5, 64, 2048):
        x, w, ids = inputs(t)
        ref = aten_ops.moe_experts_mxfp4(x, w, ids, *ws, 10.0).float()
        for v in {scv[0], scv[-1]}:
            try:
                out = msc.scaled_mxfp4(x, w, ids, *ws, 10.0, *v).float()
                rel = float((out - ref).norm() / ref.norm())
            except Exception as exc:  # noqa: BLE001 - recorded; the timing rows say it too
                print(f"parity T={t}: scaled {v} failed: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                continue
            print(f"parity T={t}: scaled {v} vs aten rel {rel:.2e}", flush=True)
            assert rel < 1e-2, rel
    x, w, ids = inputs(2048)
    ref = aten_ops.moe_experts_mxfp4(x, w, ids, *ws, 10.0).float()
    rel = float((tm.dequant_once_mxfp4(x, w, ids, *ws, 10.0).float() - ref).norm() / ref.norm())
    print(f"parity T=2048: dequant-once vs aten rel {rel:.2e}", flush=True)
    assert rel < 1e-2, rel

    variants = [(tuple(int(v) for v in s.split("x")) + (0,))[:4] for s in args.variants.split(",") if s]
    skv = [tuple(int(v) for v in s.split("x")) for s in args.splitk_variants.split(",") if s]
    splitk_rows = []

    def graph_us(fn, *a):
        """Median us of one CUDA-graph replay of ``fn(*a)`` (launch overhead removed)."""
        runner = CudaGraphRunner(fn)
        runner(*a)
        return do_bench(lambda: runner(*a), warmup=10, rep=50, return_mode="median") * 1e3
    rows = []
    score: dict[int, dict[tuple, float]] = {}  # BLOCK_M -> variant -> sum over T of (time / best time at T)
    crossover = []
    dq_int_score: dict[int, float] = {}
    for t in [int(v) for v in args.tokens.split(",") if v]:
        x, w, ids = inputs(t)
        distinct = int(torch.unique(ids).numel())
        nbytes = distinct * per_expert_bytes
        bm = tm.block_m_for(t * K, E)
        row = {"tokens": t, "pairs": t * K, "distinct": distinct, "bytes": nbytes, "block_m": bm, "grouped_us": {}}
        for v in variants:
            bn, nw, ns, ni = v
            try:
                ms = do_bench(lambda: tm.grouped_mxfp4(x, w, ids, *ws, 10.0, block_n=bn, warps=nw, stages=ns,
                                                       int_decode=ni), warmup=10, rep=50, return_mode="median")
            except Exception as exc:  # noqa: BLE001 - a variant that does not compile is recorded
                row["grouped_us"]["x".join(map(str, v))] = f"error: {type(exc).__name__}: {str(exc)[:200]}"
                continue
            row["grouped_us"]["x".join(map(str, v))] = ms * 1e3
        fastest = min((u for u in row["grouped_us"].values() if isinstance(u, float)), default=float("nan"))
        for v in variants:
            u = row["grouped_us"].get("x".join(map(str, v)))
            sc = score.setdefault(bm, {})
            sc[v] = sc.get(v, 0.0) + (u / fastest if isinstance(u, float) else 1e9)
        row["grouped_best_us"] = fastest
        row["grouped_pct_copy_bw"] = nbytes / (fastest * 1e-6) / 4.2e12 * 100
        if t * K >= 1024:
            for ni in (0, 1):
                tm.DEQUANT_INT = ni
                ms = do_bench(lambda: tm.dequant_once_mxfp4(x, w, ids, *ws, 10.0), warmup=5, rep=30,
                              return_mode="median")
                row[f"dequant_once_int{ni}_us"] = ms * 1e3
                dq_int_score[ni] = dq_int_score.get(ni, 0.0) + ms
            row["dequant_once_us"] = min(row["dequant_once_int0_us"], row["dequant_once_int1_us"])
            crossover.append((t * K, fastest, row["dequant_once_us"]))
        if t <= 64 and args.per_expert:
            def per_expert():
                def gemm3(e):
                    return (lambda a: gemm_mxfp4(a, w1[e], s1[e]), lambda a: gemm_mxfp4(a, w3[e], s3[e]),
                            lambda a: gemm_mxfp4(a, w2[e], s2[e]))
                return tm._run(x, w, ids, 10.0, gemm3)
            row["per_expert_us"] = do_bench(per_expert, warmup=3, rep=20, return_mode="median") * 1e3
        row["scaled_us"] = {}
        for v in scv:
            name = "x".join(map(str, v))
            try:
                fn = (lambda a, b, c, v=v: msc.scaled_mxfp4(a, b, c, *ws, 10.0, *v))
                if t * K <= args.splitk_max_pairs:
                    row["scaled_us"][name] = graph_us(fn, x, w, ids)
                else:
                    row["scaled_us"][name] = do_bench(lambda: fn(x, w, ids), warmup=5, rep=30,
                                                      return_mode="median") * 1e3
            except Exception as exc:  # noqa: BLE001 - a variant that does not compile is recorded
                row["scaled_us"][name] = f"error: {type(exc).__name__}: {str(exc)[:200]}"
        ok = {v: u for v, u in row["scaled_us"].items() if isinstance(u, float)}
        if ok:
            row["scaled_best"] = min(ok, key=ok.get)
            row["scaled_best_us"] = ok[row["scaled_best"]]
            row["scaled_pct_copy_bw"] = nbytes / (row["scaled_best_us"] * 1e-6) / 4.2e12 * 100
        if t * K <= args.splitk_max_pairs:
            row["splitk_graph_us"] = {}
            for sv in skv:
                bn, gr, nw, ns, pg, am = (tuple(sv) + (1,))[:6]
                try:
                    row["splitk_graph_us"]["x".join(map(str, sv))] = graph_us(
                        lambda a, b, c, bn=bn, gr=gr, nw=nw, ns=ns, pg=pg, am=am: sk.splitk_mxfp4(
                            a, b, c, *ws, 10.0, block_n=bn, groups=gr, warps=nw, stages=ns, programs=pg, asm=am),
                        x, w, ids)
                except Exception as exc:  # noqa: BLE001 - a variant that does not compile is recorded
                    row["splitk_graph_us"]["x".join(map(str, sv))] = f"error: {type(exc).__name__}: {str(exc)[:200]}"
            row["seg_graph_us"] = {}
            for r in seg_rs:
                try:
                    row["seg_graph_us"][str(r)] = graph_us(lambda a, b, c, r=r: sg.segments_mxfp4(
                        a, b, c, *ws, 10.0, pairs_per_program=r), x, w, ids)
                except Exception as exc:  # noqa: BLE001 - recorded, not fatal
                    row["seg_graph_us"][str(r)] = f"error: {type(exc).__name__}: {str(exc)[:200]}"
            ok = {v: u for v, u in row["splitk_graph_us"].items() if isinstance(u, float)}
            row["splitk_best"] = min(ok, key=ok.get) if ok else None
            row["splitk_best_us"] = ok[row["splitk_best"]] if ok else float("nan")
            row["splitk_default_us"] = ok.get("x".join(map(str, skv[0])), float("nan"))
            row["splitk_pct_copy_bw"] = nbytes / (row["splitk_best_us"] * 1e-6) / 4.2e12 * 100
        if t * K <= args.splitk_max_pairs:
            # graph replay of the grouped path: kernel time without launch overhead
            timed = {v: row["grouped_us"].get("x".join(map(str, v))) for v in variants}
            bv = min((v for v in variants if isinstance(timed[v], float)), key=lambda v: timed[v])
            row["grouped_graph_variant"] = "x".join(map(str, bv))
            row["grouped_graph_us"] = graph_us(lambda a, b, c: tm.grouped_mxfp4(
                a, b, c, *ws, 10.0, block_n=bv[0], warps=bv[1], stages=bv[2], int_decode=bv[3]), x, w, ids)
            if "splitk_best_us" in row:
                row["splitk_speedup"] = row["grouped_graph_us"] / row["splitk_best_us"]
                seg_ok = [u for u in row.get("seg_graph_us", {}).values() if isinstance(u, float)]
                small = min([row["splitk_default_us"]] + seg_ok)  # what the provider would run
                splitk_rows.append((t * K, row["grouped_graph_us"], small, row["splitk_best"]))
        rows.append(row)
        print(json.dumps(row), flush=True)
    tune = {k: (tuple(v) + (0,))[:4] for k, v in tm.TUNE.items()}
    for bm, sc in score.items():
        tune[bm] = min(sc, key=sc.get)
    # smallest measured pair count from which dequant-once wins (0 = never measured faster)
    wins = [p for p, grouped, once in crossover if once < grouped]
    # None when no row reached the dequant-once sizes (>= 1024 pairs): nothing was measured, keep the default
    dequant_pairs = (min(wins) if wins else 0) if crossover else None
    dequant_int = min(dq_int_score, key=dq_int_score.get) if dq_int_score else 0
    # split-K threshold: the largest measured pair count up to which split-K won at every measured count
    splitk_pairs = 0
    for pairs, grouped, split_us, _ in sorted(splitk_rows):
        if split_us >= grouped:
            break
        splitk_pairs = pairs
    sk_score: dict[str, float] = {}
    for pairs, grouped, _, _ in splitk_rows:
        if pairs <= max(splitk_pairs, 1):
            r = next(r for r in rows if r["pairs"] == pairs)
            ok = {v: u for v, u in r["splitk_graph_us"].items() if isinstance(u, float)}
            for v, u in ok.items():
                sk_score[v] = sk_score.get(v, 0.0) + u / min(ok.values())
    splitk_tune = min(sk_score, key=sk_score.get) if sk_score else None
    # segment path: the R with the least total time over the rows with >= 48 pairs, and the smallest measured
    # pair count from which it beats the per-pair path's default tile at every larger count
    seg_rows = [r for r in rows if isinstance(r.get("seg_graph_us"), dict) and r["pairs"] >= 48]
    seg_tot = {rr: sum(r["seg_graph_us"][rr] for r in seg_rows if isinstance(r["seg_graph_us"].get(rr), float))
               for rr in (seg_rows[0]["seg_graph_us"] if seg_rows else {})}
    seg_r = int(min(seg_tot, key=seg_tot.get)) if seg_tot else 1
    seg_min_pairs = 0
    for r in sorted((r for r in rows if isinstance(r.get("seg_graph_us"), dict)), key=lambda r: -r["pairs"]):
        su = r.get("seg_graph_us", {}).get(str(seg_r))
        if not isinstance(su, float) or su >= r["splitk_default_us"]:
            break
        seg_min_pairs = r["pairs"]
    if not seg_min_pairs:
        seg_r = 1
    print(f"segments: R={seg_r} from {seg_min_pairs} pairs; totals {seg_tot}", flush=True)
    with open(os.path.join(args.out, "moe_bench.json"), "w") as fh:
        json.dump({"arch": args.arch, "rows": rows, "tune": {str(k): v for k, v in tune.items()},
                   "dequant_pairs": dequant_pairs, "dequant_int": dequant_int, "splitk_pairs": splitk_pairs,
                   "splitk_tune": splitk_tune, "seg_r": seg_r, "seg_min_pairs": seg_min_pairs}, fh, indent=1)
    with open(os.path.join(args.out, "moe_tune.json"), "w") as fh:
        json.dump({"tune": {str(k): list(v) for k, v in tune.items()}, "dequant_pairs": dequant_pairs,
                   "dequant_int": dequant_int, "splitk_pairs": splitk_pairs, "splitk_tune": splitk_tune,
                   "seg_r": seg_r, "seg_min_pairs": seg_min_pairs}, fh)
    print(f"\n{'T':>6s} {'pairs':>6s} {'experts':>7s} {'BM':>3s} {'grouped us':>10s} {'%BW':>5s} {'graph us':>9s} "
          f"{'per-expert':>10s} {'dq-once':>8s}")
    for r in rows:
        print(f"{r['tokens']:6d} {r['pairs']:6d} {r['distinct']:7d} {r['block_m']:3d} {r['grouped_best_us']:10.1f} "
              f"{r['grouped_pct_copy_bw']:5.1f} {r.get('grouped_graph_us', float('nan')):9.1f} "
              f"{r.get('per_expert_us', float('nan')):10.1f} {r.get('dequant_once_us', float('nan')):8.1f}")
    print("variants (block_n x warps x stages), us:")
    for r in rows:
        print(f"  T={r['tokens']}: " + ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
                                                for k, v in r["grouped_us"].items()))
    print(f"split-K ({args.arch}), graph replay us: pairs, grouped, split-K best (variant), speedup")
    for r in rows:
        if "splitk_best_us" in r:
            print(f"  T={r['tokens']} P={r['pairs']}: grouped {r.get('grouped_graph_us', float('nan')):.1f}, split-K "
                  f"{r['splitk_best_us']:.1f} ({r['splitk_best']}; default {r['splitk_default_us']:.1f}), "
                  f"{r.get('splitk_speedup', float('nan')):.2f}x, {r['splitk_pct_copy_bw']:.1f}% BW; "
                  + ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
                              for k, v in r["splitk_graph_us"].items()))
    print("tl.dot_scaled path (graph replay up to --splitk-max-pairs pairs, else eager), us:")
    for r in rows:
        nan = float("nan")
        print(f"  T={r['tokens']} P={r['pairs']}: best {r.get('scaled_best')} {r.get('scaled_best_us', nan):.1f} "
              f"({r.get('scaled_pct_copy_bw', nan):.1f}% BW) vs split-K {r.get('splitk_best_us', nan):.1f}"
              f" / grouped {r.get('grouped_graph_us', r['grouped_best_us']):.1f} / dq-once "
              f"{r.get('dequant_once_us', nan):.1f}; "
              + ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in r["scaled_us"].items()))
    print("chosen:", json.dumps({"tune": tune, "dequant_pairs": dequant_pairs, "dequant_int": dequant_int,
                                 "splitk_pairs": splitk_pairs, "splitk_tune": splitk_tune}),
          f"({time.strftime('%H:%M:%S')})")


if __name__ == "__main__":
    main()
