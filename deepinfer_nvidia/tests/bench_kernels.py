"""Kernel micro-benchmarks at DeepSeek-V4-Flash widths (run on the GPU; not a pytest file).

    python -m deepinfer_nvidia.tests.bench_kernels [--out DIR]

For each op: median time of the provider kernel and of the torch reference on
the same device (``triton.testing.do_bench``, fresh random non-zero inputs),
the bytes the op must move at least (inputs read once, outputs written once),
and the achieved fraction of the copy bandwidth measured at the start of the
run. Writes ``kernels.json`` and prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch


def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth (bytes read + written per second) on 2 GiB."""
    a = torch.randn(512 << 20, device="cuda")
    b = torch.empty_like(a)
    from triton.testing import do_bench

    ms = do_bench(lambda: b.copy_(a), warmup=50, rep=200, return_mode="median")
    bw = 2 * a.numel() * 4 / (ms * 1e-3)
    del a, b
    return bw


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--skip-reference", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated name prefixes to run (default: all)")
    args = ap.parse_args()
    from triton.testing import do_bench

    from deepinfer_core.kernels.ops.quant import quant_fp8_block
    from deepinfer_core.kernels.registry import get_registry
    from deepinfer_core.kernels.resolve import ensure_platform_kernels
    from deepinfer_nvidia.platform import NvidiaPlatform

    reg = get_registry()
    ensure_platform_kernels(reg, NvidiaPlatform())
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    rows = []
    dev = "cuda"
    bf = torch.bfloat16

    only = [p for p in args.only.split(",") if p]

    def bench(name, op, provider, fn, args, kwargs, nbytes, ref=True, **variant):
        if only and not any(name.startswith(p) for p in only):
            return
        t0 = time.time()
        ms = do_bench(lambda: fn(*args, **kwargs, **variant), warmup=25, rep=100, return_mode="median")
        ref_ms = None
        if ref and not args_skip_ref:
            rfn = reg.op(op).reference
            ref_ms = do_bench(lambda: rfn(*args, **kwargs), warmup=5, rep=30, return_mode="median")
        row = dict(name=name, op=op, provider=provider, ms=ms, ref_ms=ref_ms, bytes=nbytes,
                   frac_bw=nbytes / (ms * 1e-3) / bw, variant={k: v for k, v in variant.items()},
                   wall_s=time.time() - t0)
        rows.append(row)
        print(f"{name:44s} {ms * 1e3:9.1f} us  ref {'-' if ref_ms is None else f'{ref_ms * 1e3:9.1f}'} us  "
              f"{row['frac_bw'] * 100:5.1f}% of copy BW  {variant or ''}", flush=True)

    args_skip_ref = args.skip_reference
    # -- fp8 block GEMM (UE8M0 128x128, the V4-Flash dense linears) --------------------------
    fp8 = reg.impl("gemm.fp8_block", "triton")
    for (n, k, what) in [(1024, 4096, "wq_a"), (32768, 1024, "wq_b"), (4096, 8192, "wo_b"), (2048, 4096, "shared_w1")]:
        q, s = quant_fp8_block(torch.randn(n, k, device=dev) / k ** 0.5, (128, 128), "ue8m0")
        for t in (1, 8, 64, 1024):
            x = torch.randn(t, k, device=dev, dtype=bf)
            nbytes = n * k + t * k * 2 + t * n * 2
            bench(f"fp8 {what} [{n}x{k}] T={t}", "gemm.fp8_block", "triton", fp8, (x, q, s, (128, 128)), {}, nbytes,
                  ref=t in (1, 64))
            if t == 1024 and what in ("wq_b", "wo_b") and rows and rows[-1]["name"].startswith(f"fp8 {what}"):
                w = (q.float() * 1.0).to(bf)
                ms = do_bench(lambda: x @ w.t(), warmup=25, rep=100, return_mode="median")
                fl = 2 * t * n * k
                print(f"   cuBLAS bf16 same shape {ms * 1e3:9.1f} us; fp8-triton {fl / (rows[-1]['ms'] * 1e9):.0f} "
                      f"TFLOP/s vs cuBLAS {fl / (ms * 1e9):.0f}", flush=True)
                rows[-1]["cublas_bf16_ms"] = ms
        del q, s
    # -- MXFP4 GEMM (one expert's w1 and w2) ------------------------------------------------
    mx = reg.impl("gemm.mxfp4", "triton")
    for (n, k) in [(2048, 4096), (4096, 2048)]:
        packed = torch.randint(0, 256, (n, k // 2), device=dev, dtype=torch.uint8)
        sc = torch.full((n, k // 32), 119, device=dev, dtype=torch.uint8).view(torch.float8_e8m0fnu)
        for t in (1, 8, 64, 512):
            x = torch.randn(t, k, device=dev, dtype=bf)
            bench(f"mxfp4 [{n}x{k}] T={t}", "gemm.mxfp4", "triton", mx, (x, packed, sc), {},
                  n * k // 2 + n * k // 32 + t * (n + k) * 2, ref=t == 1)
    # -- sparse attention ------------------------------------------------------------------
    att = reg.impl("attention.sparse_sink", "triton")
    h, d = 64, 512
    for (t, na, nb) in [(1, 128, 512), (8, 128, 512), (64, 128, 512), (64, 128, 32), (1024, 128, 512)]:
        sa, sb = max(4096, t * na), max(4096, t * nb)
        q = torch.randn(t, h, d, device=dev, dtype=bf)
        kva = torch.randn(sa, d, device=dev, dtype=bf)
        kvb = torch.randn(sb, d, device=dev, dtype=bf)
        ia = torch.randint(0, sa, (t, na), device=dev)
        ib = torch.randint(0, sb, (t, nb), device=dev)
        sinks = torch.randn(h, device=dev)
        nbytes = t * (na + nb) * d * 2 + 2 * t * h * d * 2 + t * (na + nb) * 8
        a = (q, kva, ia, kvb, ib, sinks, d ** -0.5)
        bench(f"attn T={t} Na={na} Nb={nb}", "attention.sparse_sink", "triton", att, a, {}, nbytes, ref=t <= 64)
        for bh in (32, 64):
            bench(f"attn T={t} Na={na} Nb={nb} bh={bh}", "attention.sparse_sink", "triton", att, a, {}, nbytes,
                  ref=False, block_h=bh)
        if t >= 64 and len(rows) >= 3 and rows[-3]["name"] == f"attn T={t} Na={na} Nb={nb}":
            fl = 4 * t * h * (na + nb) * d
            print(f"   attention {fl / (rows[-3]['ms'] * 1e9):.0f} TFLOP/s", flush=True)
    # -- mHC mix -------------------------------------------------------------------------------
    mix = reg.impl("mhc.mix", "triton")
    fnw = torch.randn(24, 16384, device=dev) / 128
    base = torch.randn(24, device=dev)
    scale = torch.rand(3, device=dev) + 0.5
    for t in (1, 64, 1024):
        r = torch.randn(t, 4, 4096, device=dev, dtype=bf)
        bench(f"mhc.mix T={t}", "mhc.mix", "triton", mix, (r, fnw, base, scale, 1e-6, 1e-6, 20), {},
              24 * 16384 * 4 + t * 16384 * 2, ref=t <= 64)
    # -- indexer scores ---------------------------------------------------------------------------
    sc_fn = reg.impl("index.scores", "triton")
    for (t, n) in [(1, 1024), (64, 1024), (1024, 256)]:
        q = torch.randn(t, 64, 128, device=dev, dtype=bf)
        w = torch.randn(t, 64, device=dev)
        keys = torch.randn(8192, 128, device=dev, dtype=bf)
        cand = torch.randint(0, 8192, (t, n), device=dev)
        bench(f"index.scores T={t} N={n}", "index.scores", "triton", sc_fn, (q, w, keys, cand, 128 ** -0.5), {},
              t * n * (128 * 2 + 8 + 4) + t * 64 * 128 * 2, ref=t <= 64)
    # -- norm / rope -----------------------------------------------------------------------------
    x = torch.randn(64, 64, 512, device=dev, dtype=bf)
    bench("norm.rms_unweighted [64,64,512]", "norm.rms_unweighted", "triton", reg.impl("norm.rms_unweighted", "triton"),
          (x, 1e-6), {}, 2 * x.numel() * 2)
    xw = torch.randn(1024, 4096, device=dev, dtype=bf)
    bench("norm.rms [1024,4096]", "norm.rms", "triton", reg.impl("norm.rms", "triton"),
          (xw, torch.rand(4096, device=dev), 1e-6), {}, 2 * xw.numel() * 2)
    pos = torch.randint(0, 100000, (64,), device=dev)
    f = 1.0 / (10000 ** (torch.arange(0, 64, 2, device=dev).float() / 64))
    bench("rope [64,64,512]", "rope.interleaved", "triton", reg.impl("rope.interleaved", "triton"), (x, pos, f), {},
          2 * x.numel() * 2)
    # -- routed experts (aten grouped GEMM over dense bf16 stacks) ------------------------------------
    e, dd, ff, k = 256, 4096, 2048, 6
    w1 = torch.randn(e, ff, dd, device=dev, dtype=bf) / 64
    w3 = torch.randn(e, ff, dd, device=dev, dtype=bf) / 64
    w2 = torch.randn(e, dd, ff, device=dev, dtype=bf) / 45
    moe = reg.impl("moe.experts", "aten")
    for t in (1, 8, 64, 1024):
        x = torch.randn(t, dd, device=dev, dtype=bf)
        ids = torch.rand(t, e, device=dev).argsort(dim=1)[:, :k]
        wts = torch.rand(t, k, device=dev)
        uniq = int(ids.unique().numel())
        bench(f"moe.experts bf16 T={t} ({uniq} experts)", "moe.experts", "aten", moe, (x, wts, ids, w1, w3, w2, 10.0),
              {}, uniq * 3 * ff * dd * 2, ref=t <= 8)
    out = os.path.join(args.out, "kernels.json")
    with open(out, "w") as fh:
        json.dump({"copy_bw": bw, "rows": rows, "device": torch.cuda.get_device_name()}, fh, indent=1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
