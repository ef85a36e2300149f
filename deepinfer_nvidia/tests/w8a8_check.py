"""The MXFP8-activation GEMV (``gluon_w8a8_gemv``) against the bf16 one (``gluon_fp8_gemv``) at one V4.1 layer's
shapes on the GPU: errors and timings (not a pytest file; thirty-fifth pass).

    python3 -m deepinfer_nvidia.tests.w8a8_check [--rows 1,8] [--variants 4:0,4:1,3:1]

For each shape and row count: the largest error of each kernel against its own pure-torch model (relative to the
output's largest magnitude), the MXFP8 output's error against the bf16 reference (what the numerics choice costs),
and whether two launches are bit-equal. Then the layer's six GEMVs timed in one CUDA graph over enough weight
copies to defeat L2, under programmatic dependent launch: the bf16 kernel, then the MXFP8 one in each variant (ring
depth, x quantised up front or in the loop).
Exits 1 when an output is off its model by more than 1% or not deterministic.
"""
from __future__ import annotations

import argparse
import sys

import torch

from deepinfer_nvidia.tests.graph_timing import graph_us
from deepinfer_nvidia.tests.prefetch_check import _ints, layer_weights


def main() -> None:
    from deepinfer_core.kernels.ops.gemm import fp8_block
    from deepinfer_nvidia.kernels import gluon_fp8_gemv as gg, gluon_w8a8_gemv as gw, triton_gemm as tg

    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,8")
    ap.add_argument("--variants", default="4:0,4:1,3:1", help="stages:xloop of the MXFP8 kernel to time")
    args = ap.parse_args()
    dev = torch.device("cuda")
    sms = tg._sm_count(dev)
    g = torch.Generator().manual_seed(0)
    weights = layer_weights(g)
    layer_mb = sum(q.numel() + s.numel() for *_, q, s in weights) / 1e6
    copies = max(2, -(-300 // int(layer_mb)))  # > 300 MB of weights a replay: nothing stays in L2
    ring = [[(q.cuda(), s.view(torch.uint8).contiguous().cuda()) for *_, q, s in weights] for _ in range(copies)]
    ok = True
    for m in _ints(args.rows):
        xs = {k * groups: torch.randn(m, k * groups, generator=g).bfloat16() for _, _, k, groups, _, _ in weights}
        xcs = {kk: v.cuda() for kk, v in xs.items()}

        def bf16(i, q, s):
            _, n, k, groups, _, _ = weights[i]
            return gg.gemv_wgmma(xcs[k * groups], q, s, s.shape[1], 32, 32, sms, ng=n // groups if groups > 1 else None)

        def w8a8(i, q, s, stages=None, xloop=None):
            _, n, k, groups, _, _ = weights[i]
            return gw.gemv_w8a8(xcs[k * groups], q, s, s.shape[1], 32, 32, sms, ng=n // groups if groups > 1 else None,
                                stages=stages, xloop=xloop)

        for i, (name, n, k, groups, q, s) in enumerate(weights):
            x = xs[k * groups]
            ng, kg = n // groups, k
            ref16 = torch.cat([fp8_block(x[:, j * kg:(j + 1) * kg], q[j * ng:(j + 1) * ng],
                                         s[j * ng // 32:(j + 1) * ng // 32], (32, 32)).float() for j in range(groups)], 1)
            ref8 = torch.cat([gw.w8a8_reference(x[:, j * kg:(j + 1) * kg], q[j * ng:(j + 1) * ng],
                                                s[j * ng // 32:(j + 1) * ng // 32], 32, 32) for j in range(groups)], 1)
            qc, sc = ring[0][i]
            o16, o8 = bf16(i, qc, sc).float().cpu(), w8a8(i, qc, sc).float().cpu()
            scale = ref16.abs().max().item()
            e16 = (o16 - ref16).abs().max().item() / scale
            e8 = (o8 - ref8).abs().max().item() / scale
            e8_16 = (o8 - ref16).abs().max().item() / scale
            rms8_16 = ((o8 - ref16).pow(2).mean().sqrt() / ref16.pow(2).mean().sqrt()).item()
            same = bool(torch.equal(w8a8(i, qc, sc), w8a8(i, qc, sc)))
            same &= bool(torch.equal(w8a8(i, qc, sc, xloop=True), w8a8(i, qc, sc)))  # the same sums either way
            good = e8 < 1e-2 and same
            ok &= good
            plan = gw.launch_plan(m, n, k, sms)
            print(f"{name:16s} [{n}x{k * groups}] M={m}: bf16 kernel err {e16:.1e}; mxfp8 kernel err {e8:.1e} "
                  f"(tiles {plan[0]} x split {plan[3]}, {plan[2] // 128} K tiles); mxfp8 vs the bf16 reference: max "
                  f"{e8_16:.1e}, rms {rms8_16:.1e}; deterministic {same}{'' if good else '  FAILED'}", flush=True)

        def layer(fn, **kw):
            for copy in ring:
                for i, (q, s) in enumerate(copy):
                    fn(i, q, s, **kw)

        line = f"layer GEMVs M={m} ({layer_mb:.0f} MB):"
        us = graph_us(lambda: layer(bf16), warmup=5, rep=40) / copies
        line += f" bf16 {us:6.1f} us ({layer_mb / us:4.2f} TB/s)"
        for v in args.variants.split(","):
            st, xl = (int(t) for t in v.split(":"))
            us = graph_us(lambda: layer(w8a8, stages=st, xloop=bool(xl)), warmup=5, rep=40) / copies
            line += f"; mxfp8 stages {st} xloop {xl} {us:6.1f} us ({layer_mb / us:4.2f} TB/s)"
        us = graph_us(lambda: layer(bf16), warmup=5, rep=40) / copies
        line += f"; bf16 again {us:6.1f} us"
        print(line, flush=True)
    print("w8a8 check ok" if ok else "W8A8 CHECK FAILED", flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
