"""FP8 [32, 32]-block GEMMs at DeepSeek-V4.1 widths (H200; not run in CI): the general kernel (K tiles of one
scale block) against the fine-scale kernel's variants and, for a few rows, the CUDA-core GEMV's. Every call is
replayed from a CUDA graph, and the copy bandwidth is measured in the same run.

    python3 -m deepinfer_nvidia.tests.bench_fp8 --out $OUT [--rows 1,2,4,8,64] [--ring-mb 256]

Prints one line per (shape, rows, variant): median us, and the % of the copy bandwidth the weight bytes reach. Each
is measured twice:
- one graph replay per call, which includes the replay's own ~10 us;
- per call inside a ring of weight copies replayed as one graph (``--ring-mb``). The copies defeat L2, so this is
  the kernel's own time.

Then a per-rows summary of one V4.1 layer's dense FP8 GEMMs (the shapes below, wo_a counted 8 times).
Writes ``fp8_bench.json`` under --out.
"""
from __future__ import annotations

import argparse
import json
import os

import torch

# One V4.1 layer's FP8 linears (N, K, times per layer): wq_a, wq_b, wkv, wo_a (8 groups), wo_b, indexer wq_b,
# shared expert w1 and w3, shared expert w2.
V41_SHAPES = [("wq_a", 1280, 5120, 1), ("wq_b", 32768, 1280, 1), ("wkv", 512, 5120, 1), ("wo_a", 1024, 4096, 8),
              ("wo_b", 5120, 8192, 1), ("idx_wq_b", 4096, 1280, 1), ("shared_w13", 2304, 5120, 2),
              ("shared_w2", 5120, 2304, 1)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    ap.add_argument("--rows", default="1,2,4,8,64")
    ap.add_argument("--variants", default="128x64x2x4x4,256x32x4x4x3",
                    help="block_k x block_n x programs-per-SM x warps x stages")
    ap.add_argument("--gemv-variants", default="32x256x4x4,64x256x4x4,16x256x4x4,32x128x4x4,32x512x4x4,32x256x8x8",
                    help="block_n x block_k x programs-per-SM x warps [x min K tiles per split], for rows <= "
                         "--gemv-rows")
    ap.add_argument("--gemv-rows", type=int, default=8)
    ap.add_argument("--wgmma-programs", default="4,16", help="programs per SM of the wgmma GEMV candidates, "
                    "optionally with the one-wave cap of resident programs per SM (4r7) "
                    "(rows <= its max_rows; twelfth pass)")
    ap.add_argument("--wgmma-stages", default="", help="cp.async ring depths of the wgmma GEMV candidates "
                    "(crossed with --wgmma-programs; empty: WGMMA_GEMV_TUNE's)")
    ap.add_argument("--wgmma-tma", default="0", help="weight tiles by cp.async (0) / TMA (1) for the wgmma "
                    "GEMV candidates, e.g. 0,1")
    ap.add_argument("--wgmma-swizzle", default="1", help="weight ring unswizzled (0) / rows with XOR-swizzled "
                    "16-byte chunks (1, GEMV_SWIZZLE) for the cp.async wgmma GEMV candidates, e.g. 0,1")
    ap.add_argument("--wgmma-pdl", default="0", help="programmatic dependent launch off (0) / on (1) for the wgmma "
                    "candidates, crossed with the above: in a ring each call's weight prologue then overlaps the "
                    "previous call's tail")
    ap.add_argument("--ring-mb", type=int, default=256,
                    help="also time each candidate over weight copies totalling this many MB in one graph (0: off)")
    args = ap.parse_args()
    from triton.testing import do_bench

    from deepinfer_core.kernels.ops.gemm import fp8_block
    from deepinfer_core.kernels.ops.quant import quant_fp8_block
    from deepinfer_nvidia.graphs import CudaGraphRunner
    from deepinfer_nvidia.kernels import gluon_fp8_gemv as gg
    from deepinfer_nvidia.kernels import triton_fp8_fine as ff
    from deepinfer_nvidia.kernels import triton_fp8_gemv as gv
    from deepinfer_nvidia.kernels import triton_gemm as tg

    dev = torch.device("cuda")
    sms = tg._sm_count(dev)
    big = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    copy_bw = 2 * big.numel() / (do_bench(lambda: big.clone(), warmup=5, rep=50, return_mode="median") * 1e-3)
    del big
    print(f"copy bandwidth {copy_bw / 1e12:.2f} TB/s, {sms} SMs", flush=True)

    def graph_us(fn, *a):
        runner = CudaGraphRunner(fn)
        runner(*a)
        return do_bench(lambda: runner(*a), warmup=10, rep=60, return_mode="median") * 1e3

    variants = [tuple(int(v) for v in s.split("x")) for s in args.variants.split(",") if s]
    rows_out = []
    layer: dict = {}
    ring_layer: dict = {}
    g = torch.Generator().manual_seed(0)
    for name, n, k, times in V41_SHAPES:
        q, s = quant_fp8_block(torch.randn(n, k, generator=g) / k ** 0.5, (32, 32), "ue8m0")
        qc, sc = q.cuda(), s.view(torch.uint8).contiguous().cuda()
        wbytes = n * k + sc.numel()
        for m in [int(v) for v in args.rows.split(",") if v]:
            x = torch.randn(m, k, generator=g).bfloat16().cuda()
            ref = fp8_block(x.float().cpu(), q, s, (32, 32))
            res = {"shape": name, "n": n, "k": k, "rows": m, "times": times, "bytes": wbytes, "us": {}}
            sb = s.shape[1]
            # every candidate takes its weight (qq, ss) as arguments, so the ring below can feed it copies
            cands = {"general": lambda a, qq, ss: tg._launch_fp8(a, qq, ss, sb, 32, 32, True,
                                                                  tg._tiles(m, n, k, a.dtype, dev, 32))}
            for v in variants:
                bk, bn, pg, nw, ns = v
                cands["fine " + "x".join(map(str, v))] = (
                    lambda a, qq, ss, bk=bk, bn=bn, pg=pg, nw=nw, ns=ns: ff.gemm_fp8_fine(
                        a, qq, ss, sb, 32, 32, True, sms, block_k=bk, block_n=bn, programs=pg, warps=nw, stages=ns))
            if m <= args.gemv_rows:
                for v in [tuple(int(a) for a in gs.split("x")) for gs in args.gemv_variants.split(",") if gs]:
                    bn, bk, pg, nw, mi = (v + (0,))[:5]
                    cands["gemv " + "x".join(map(str, v))] = (
                        lambda a, qq, ss, bn=bn, bk=bk, pg=pg, nw=nw, mi=mi: gv.gemm_fp8_gemv(
                            a, qq, ss, sb, 32, 32, True, sms, block_n=bn, block_k=bk, programs=pg, warps=nw,
                            min_iters=mi or None))
            if m <= gg.WGMMA_GEMV_TUNE["max_rows"] and gg.takes(x, qc, 32, 32, True):
                for pg, rs in [(int(v.split("r")[0]), int(v.split("r")[1]) if "r" in v else 0)
                               for v in args.wgmma_programs.split(",") if v]:
                    for st in [int(v) for v in args.wgmma_stages.split(",") if v] or [0]:
                        for pd in [int(v) for v in args.wgmma_pdl.split(",") if v]:
                            for tm, sw in [(int(t), int(w)) for t in args.wgmma_tma.split(",") if t
                                           for w in args.wgmma_swizzle.split(",") if w and not (int(t) and int(w))]:
                                cands[f"wgmma p{pg}" + (f"s{st}" if st else "") + ("pdl" if pd else "")
                                      + ("tma" if tm else "") + ("" if sw or tm else "plain")
                                      + (f"r{rs}" if rs else "")] = (
                                    lambda a, qq, ss, pg=pg, st=st, pd=pd, tm=tm, rs=rs, sw=sw: gg.gemv_wgmma(
                                        a, qq, ss, sb, 32, 32, sms, programs=pg, stages=st or None, pdl=bool(pd),
                                        tma=bool(tm), resident=rs, swizzle=bool(sw)))
            cands["provider"] = lambda a, qq, ss: tg.gemm_fp8_block(a, qq, ss.view(torch.float8_e8m0fnu),  # noqa: E731
                                                                    (32, 32))
            # ring: enough weight copies that they do not stay in L2 (50 MB on the H200), all in one graph, so
            # the per-call time excludes the replay's fixed cost that one graph per call includes
            copies = max(2, min(32, -(-(args.ring_mb << 20) // wbytes)))
            ring = [(qc.clone(), sc.clone()) for _ in range(copies)] if args.ring_mb else []
            res["ring_copies"] = copies if ring else 0
            res["ring_us"] = {}
            for label, fn in cands.items():
                try:
                    rel = float((fn(x, qc, sc).float().cpu() - ref).norm() / ref.norm())
                    us = graph_us(lambda a, fn=fn: fn(a, qc, sc), x)
                    if ring:
                        res["ring_us"][label] = graph_us(
                            lambda a, fn=fn: [fn(a, qq, ss) for qq, ss in ring], x) / copies
                except Exception as exc:  # noqa: BLE001 - a variant that does not compile is recorded
                    res["us"][label] = f"error: {type(exc).__name__}: {str(exc)[:200]}"
                    print(f"{name} [{n}x{k}] M={m} {label}: {res['us'][label]}", flush=True)
                    continue
                res["us"][label] = us
                pct = 100 * wbytes / (us * 1e-6) / copy_bw
                rus = res["ring_us"].get(label, float("nan"))
                print(f"{name} [{n}x{k}] M={m} {label}: {us:.1f} us ({pct:.0f}% of copy BW); in a ring of {copies} "
                      f"calls per graph {rus:.1f} us ({100 * wbytes / (rus * 1e-6) / copy_bw:.0f}%); rel {rel:.1e}",
                      flush=True)
                assert rel < 2e-2, (label, rel)
            del ring
            rows_out.append(res)
            tot = layer.setdefault(m, {})
            for label, us in res["us"].items():
                if isinstance(us, float):
                    tot[label] = tot.get(label, 0.0) + times * us
            rtot = ring_layer.setdefault(m, {})
            for label, us in res["ring_us"].items():
                rtot[label] = rtot.get(label, 0.0) + times * us
    print("\none V4.1 layer of FP8 linears (us; roofline = bytes / copy BW):")
    layer_bytes = sum(n * k * t for _, n, k, t in V41_SHAPES)
    for m, tot in layer.items():
        best = min(((u, lab) for lab, u in tot.items() if lab.startswith("fine")), default=(float("nan"), "-"))
        gbest = min(((u, lab) for lab, u in tot.items() if lab.startswith(("gemv", "wgmma"))),
                    default=(float("nan"), "-"))
        nan = float("nan")
        print(f"M={m}: general {tot.get('general', nan):.0f}, provider {tot.get('provider', nan):.0f}, "
              f"best fine {best[0]:.0f} ({best[1]}), best gemv / wgmma {gbest[0]:.0f} ({gbest[1]}), "
              f"roofline {layer_bytes / copy_bw * 1e6:.0f}", flush=True)
        rtot = ring_layer.get(m, {})
        if rtot:
            print("  in rings (no per-call replay cost): " + ", ".join(
                f"{lab} {u:.0f}" for lab, u in sorted(rtot.items(), key=lambda kv: kv[1])), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "fp8_bench.json"), "w") as f:
        json.dump({"copy_bw": copy_bw, "rows": rows_out, "layer_us": layer, "ring_layer_us": ring_layer,
                   "layer_bytes": layer_bytes}, f, indent=1)


if __name__ == "__main__":
    main()
