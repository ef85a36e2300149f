"""``gemm.dense``'s Triton GEMV against cuBLAS at DeepSeek-V4.1's small float projections (H200; not run in CI).

    python3 -m deepinfer_nvidia.tests.bench_dense_gemv [--rows 1,2,4] [--ring-mb 256] [--wide]

For each shape (the MoE router, the compressors' wkv / wgate, the index keys' wk; fp32 as the model keeps them)
and row count: the Triton GEMV (``triton_dense_gemv.gemv``) and cuBLAS (``aten_ops.gemm_dense``), each timed per
call inside a ring of weight copies replayed as one CUDA graph (the copies defeat L2, so this is the kernels'
own time and the launch gaps between them, as in a step), with PDL on as in the engine. Prints us per call, the %
of the copy bandwidth the weight bytes reach, cuBLAS / Triton, and the max relative error of each against a
float64 product. Writes ``dense_gemv.json`` under --out.

``--wide``: ``gemm.dense_wide``'s operands instead (a bf16 x, the weight in fp32 as loaded by default or in bf16 as
the checkpoint stores it): the GEMV widening them (``gemv_w32``, ``gemv_w16``; all rows in one block) against the
casts and cuBLAS (``cublas_w32``: x cast; ``cublas_w16``: x and the weight cast, which is what a half weight costs
above ``GEMV_MAX_ROWS``). Writes ``dense_wide.json``. (``docs/perf/pass44c`` ran it on the removed row-block form.)
"""
from __future__ import annotations

import argparse
import json
import os

import torch

# (name, N, K): V4.1 at hidden 5120
SHAPES = [("router", 384, 5120), ("compressor wkv", 512, 5120), ("compressor wgate", 512, 5120),
          ("index wk", 128, 5120)]


def _copy_bandwidth(dev: torch.device, do_bench) -> float:
    """Bytes/s of a 1 GiB device copy (read + write), the roofline's bandwidth."""
    big = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    return 2 * big.numel() / (do_bench(lambda: big.clone(), warmup=5, rep=50, return_mode="median") * 1e-3)


def _ring_us(fn, x: torch.Tensor, w: torch.Tensor, ring_mb: int, do_bench) -> float:
    """us per call of ``fn(x, w)`` over a ring of copies of w (more bytes than L2 holds) replayed as one CUDA graph."""
    from deepinfer_nvidia.graphs import CudaGraphRunner

    copies = max(2, min(64, -(-(ring_mb << 20) // w.nbytes)))
    ring = [w.clone() for _ in range(copies)]
    runner = CudaGraphRunner(lambda a: [fn(a, ww) for ww in ring])
    runner(x)
    return do_bench(lambda: runner(x), warmup=10, rep=60, return_mode="median") * 1e3 / copies


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    ap.add_argument("--rows", default="1,2,4")
    ap.add_argument("--ring-mb", type=int, default=256)
    ap.add_argument("--wide", action="store_true")
    args = ap.parse_args()
    if args.wide:
        return wide(args)
    from triton.testing import do_bench

    from deepinfer_nvidia.kernels import aten_ops
    from deepinfer_nvidia.kernels import triton_dense_gemv as dg
    from deepinfer_nvidia.kernels.triton_gemm import _sm_count

    dev = torch.device("cuda")
    sms = _sm_count(dev)
    copy_bw = _copy_bandwidth(dev, do_bench)
    print(f"copy bandwidth {copy_bw / 1e12:.2f} TB/s, {sms} SMs", flush=True)
    cands = {"triton": lambda a, w: dg.gemv(a, w, sms), "cublas": aten_ops.gemm_dense}
    g = torch.Generator().manual_seed(0)
    rows_out = []
    for name, n, k in SHAPES:
        w = (torch.randn(n, k, generator=g) / k ** 0.5).cuda()
        for m in [int(v) for v in args.rows.split(",") if v]:
            x = torch.randn(m, k, generator=g).cuda()
            exact = x.double() @ w.double().t()
            res = {"shape": name, "n": n, "k": k, "rows": m, "plan": dg.plan(m, n, k, sms), "us": {}, "rel": {}}
            for label, fn in cands.items():
                out = fn(x, w)
                res["rel"][label] = float((out.double() - exact).abs().max() / exact.abs().max())
                res["us"][label] = _ring_us(fn, x, w, args.ring_mb, do_bench)
            t, c = res["us"]["triton"], res["us"]["cublas"]
            pct = lambda us: 100 * w.nbytes / (us * 1e-6) / copy_bw  # noqa: E731
            print(f"{name} [{n}x{k}] M={m} plan {res['plan']}: triton {t:.2f} us ({pct(t):.0f}%), cublas {c:.2f} us "
                  f"({pct(c):.0f}%), cublas/triton {c / t:.2f}x; rel err {res['rel']['triton']:.1e} / "
                  f"{res['rel']['cublas']:.1e}", flush=True)
            rows_out.append(res)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "dense_gemv.json"), "w") as fh:
        json.dump({"copy_bw": copy_bw, "rows": rows_out}, fh, indent=1)


def wide(args) -> None:
    from triton.testing import do_bench

    from deepinfer_nvidia.kernels import aten_ops
    from deepinfer_nvidia.kernels import triton_dense_gemv as dg
    from deepinfer_nvidia.kernels.triton_gemm import _sm_count

    dev = torch.device("cuda")
    sms = _sm_count(dev)
    copy_bw = _copy_bandwidth(dev, do_bench)
    print(f"copy bandwidth {copy_bw / 1e12:.2f} TB/s, {sms} SMs", flush=True)
    f32 = torch.float32
    cands = {"gemv_w32": (f32, lambda a, w: dg.gemv(a, w, sms, widen=True, out_dtype=f32)),
             "gemv_w16": (torch.bfloat16, lambda a, w: dg.gemv(a, w, sms, widen=True, out_dtype=f32)),
             "cublas_w32": (f32, lambda a, w: aten_ops.gemm_dense(a.float(), w)),
             "cublas_w16": (torch.bfloat16, lambda a, w: aten_ops.gemm_dense(a.float(), w.float()))}
    g = torch.Generator().manual_seed(0)
    rows_out = []
    for name, n, k in SHAPES[:3]:
        w0 = torch.randn(n, k, generator=g) / k ** 0.5
        for m in [int(v) for v in args.rows.split(",") if v]:
            x = torch.randn(m, k, generator=g).bfloat16().cuda()
            exact = x.double() @ w0.bfloat16().double().cuda().t()
            res = {"shape": name, "n": n, "k": k, "rows": m, "plan": dg.plan(m, n, k, sms), "us": {}, "rel": {}}
            for label, (wd, fn) in cands.items():
                w = w0.bfloat16().to(wd).cuda()  # the same values (bf16-representable) in either dtype
                out = fn(x, w)
                res["rel"][label] = float((out.double() - exact).abs().max() / exact.abs().max())
                res["us"][label] = _ring_us(fn, x, w, args.ring_mb, do_bench)
            print(f"{name} [{n}x{k}] M={m} plan {res['plan']}: " + ", ".join(
                f"{lab} {us:.2f} us" for lab, us in res["us"].items()) + f"; rel err {max(res['rel'].values()):.1e}",
                flush=True)
            rows_out.append(res)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "dense_wide.json"), "w") as fh:
        json.dump({"copy_bw": copy_bw, "rows": rows_out}, fh, indent=1)


if __name__ == "__main__":
    main()
