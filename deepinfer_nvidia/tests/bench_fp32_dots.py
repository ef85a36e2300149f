"""The prefill's fp32 products on the GPU: launch variants, error and time (not a pytest file; sixteenth pass).

    python -m deepinfer_nvidia.tests.bench_fp32_dots [--out DIR] [--tokens 1024,8192] [--decode-tokens 1,8,64]
        [--mix 32x128x4x3:t,...]        mhc.mix prefill launches: BLOCK_T x BLOCK_K x warps x stages, then
                                        :t (tf32x3 on fp32 x) or :b (fn in three bf16 pieces)

1. ``mhc.mix`` at V4.1 width (n 4, D 5120, bf16 residual): every ``--mix`` launch of the prefill projection
   against the fp32 reference (max abs error of pre / post / comb) and its time (CUDA-graph replay, median of
   ``do_bench``), with the residual's bytes over the time; then, at ``--decode-tokens`` sizes, the decode-sized
   launch and its ``decode_launch`` variants (gate warps, bf16 pieces, fewer splits with a pipeline).
2. fp32 ``gemm.dense`` at the compressor shapes (K 5120, N 512 and 128): cuBLAS fp32 (torch's default, CUDA
   cores; what the provider runs) and cuBLAS TF32 (one TF32 product: the precision we do not take), each with
   its max relative error against a float64 product and its time and TFLOP/s. (``pass16a`` also timed a Triton
   tf32x3 GEMM here: 1.2-18.5x slower than cuBLAS fp32 except at 8192 rows x 512 and in one 8192 x 128 tile
   shape; removed.)
A launch with an error above 1e-4 (relative, against float64) is printed as FAIL and the run exits 1.
Writes ``fp32_dots.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from deepinfer_nvidia.tests.graph_timing import graph_us


def _ints(spec: str) -> list[tuple[int, ...]]:
    return [tuple(int(v) for v in s.split("x")) for s in spec.split(",") if s]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--tokens", default="1024,8192")
    ap.add_argument("--decode-tokens", default="1,8,64")
    ap.add_argument("--mix", default="32x128x4x3:t,64x64x4x3:b,128x64x8x3:b,256x64x8x3:b,128x128x8x3:b")
    args = ap.parse_args()
    from deepinfer_core.kernels.ops.mhc import mhc_mix
    from deepinfer_nvidia.kernels import triton_mhc as tm

    os.makedirs(args.out, exist_ok=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    rows: list[dict] = []
    failed = False

    def note(row: dict, checked: bool = True) -> None:
        nonlocal failed
        ok = row["err"] <= 1e-4 or not checked
        failed |= not ok
        rows.append(row)
        print(f"{row['what']:<40} T={row['t']:<5} {row['us']:9.1f} us  {row.get('rate', ''):>14}  "
              f"err {row['err']:.2e}{'' if ok else '  FAIL'}", flush=True)

    n, d = 4, 5120
    fn = torch.randn((2 + n) * n, n * d, generator=g, device="cuda") / (n * d) ** 0.5
    base = torch.randn((2 + n) * n, generator=g, device="cuda")
    scale = torch.rand(3, generator=g, device="cuda") + 0.5
    for t in (int(v) for v in args.tokens.split(",") if v):
        r = torch.randn(t, n, d, generator=g, device="cuda").bfloat16()
        ref = mhc_mix(r, fn, base, scale, 1e-6, 1e-6, 20)
        gb = r.numel() * 2 / 1e9
        for spec in args.mix.split(","):
            shape, _, mode = spec.partition(":")
            launch = _ints(shape)[0]

            def run(launch=launch, split=mode != "t"):
                tm.SPLIT_FN_BF16 = split
                return tm.mix(r, fn, base, scale, 1e-6, 1e-6, 20, prefill_launch=launch)
            out = run()
            err = max((o - rr).abs().max().item() / rr.abs().max().item() for o, rr in zip(out, ref))
            us = graph_us(run, mode="mean")
            note({"what": f"mhc.mix {spec}", "t": t, "us": us,
                  "rate": f"{gb / us * 1e6:.0f} GB/s", "err": err})
    # decode sizes (CUDA graphs, as decode runs): the default launch and the decode_launch variants
    # (pass16i measured these against the ieee launch of 256 splits, then the module's default)
    decode_variants = {"default": {}, "ieee": {"split_fn": False, "stages": None, "gate_warps": 1},
                       "gate2": {"split_fn": False, "gate_warps": 2}, "gate4": {"split_fn": False, "gate_warps": 4},
                       "pieces+gate4": {"split_fn": True, "gate_warps": 4},
                       "s64x3+gate4": {"split_fn": False, "splits": 64, "stages": 3, "gate_warps": 4},
                       "pieces s64x3+gate4": {"split_fn": True, "splits": 64, "stages": 3, "gate_warps": 4},
                       "pieces s128x2+gate4": {"split_fn": True, "splits": 128, "stages": 2, "gate_warps": 4}}
    for t in (int(v) for v in args.decode_tokens.split(",") if v):
        r = torch.randn(t, n, d, generator=g, device="cuda").bfloat16()
        ref = mhc_mix(r, fn, base, scale, 1e-6, 1e-6, 20)
        for name, dl in decode_variants.items():
            def run(dl=dl):
                return tm.mix(r, fn, base, scale, 1e-6, 1e-6, 20, decode_launch=dl)
            out = run()
            err = max((o - rr).abs().max().item() / rr.abs().max().item() for o, rr in zip(out, ref))
            note({"what": f"mhc.mix decode {name}", "t": t, "us": graph_us(run, mode="mean"), "err": err})
    for t in (int(v) for v in args.tokens.split(",") if v):
        for nout in (512, 128):
            x = torch.randn(t, 5120, generator=g, device="cuda")
            w = torch.randn(nout, 5120, generator=g, device="cuda") / 5120 ** 0.5
            ref = x.double() @ w.double().t()
            flop = 2 * t * nout * 5120

            def rel(y):
                return ((y.double() - ref).abs().max() / ref.abs().max()).item()

            def cublas(tf32: bool):
                def f():
                    torch.backends.cuda.matmul.allow_tf32 = tf32
                    try:
                        return x @ w.t()
                    finally:
                        torch.backends.cuda.matmul.allow_tf32 = False
                return f
            for name, f in (("cuBLAS fp32", cublas(False)), ("cuBLAS tf32 (x1)", cublas(True))):
                err, us = rel(f()), graph_us(f, mode="mean")
                # one TF32 product is shown for the trade, never taken: its error is not a failure
                note({"what": f"{name} N={nout}", "t": t, "us": us, "rate": f"{flop / us / 1e6:.0f} TFLOP/s",
                      "err": err}, checked="x1" not in name)
    with open(os.path.join(args.out, "fp32_dots.json"), "w") as fh:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, fh, indent=1)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
