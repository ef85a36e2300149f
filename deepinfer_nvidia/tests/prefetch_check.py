"""Bulk L2 prefetch ahead of the weight rings (``l2_prefetch``) on the GPU: bit-equality, then timings (not a pytest
file; thirty-fourth pass).

    python3 -m deepinfer_nvidia.tests.prefetch_check [--gemv 0,4,6,8] [--swap 0,4,6,8] [--rows 1,8]

1. The wgmma FP8 GEMV (``gluon_fp8_gemv``) at one V4.1 layer's shapes as the model runs them (the merged
   wq_a + wkv and wq_b + indexer wq_b, the grouped wo_a, wo_b, the shared expert): for each prefetch distance the
   output must be bit-equal to the distance-0 launch (a prefetch moves no data the kernel reads). Then the layer's
   GEMVs timed in one CUDA graph over enough weight copies to defeat L2, under programmatic dependent launch, twice:
   back to back, and with an RMSNorm launch before each GEMV (as in the step, where a small kernel precedes most
   GEMVs and the prologue's prefetch can overlap it).
2. The two-warpgroup swap experts (``gluon_swap_pair``) at one and eight tokens, 384 experts: bit-equal to
   distance 0, then us a call in a graph.

Prints one line per check and timing; exits 1 on any unequal output.
"""
from __future__ import annotations

import argparse
import sys

import torch

from deepinfer_nvidia.tests.graph_timing import graph_us

# One V4.1 layer's FP8 GEMVs as the model launches them with the merged projections: (name, N, K, groups).
LAYER = [("wq_a+wkv", 1792, 5120, 1), ("wq_b+idx", 36864, 1280, 1), ("wo_a (8 groups)", 8192, 4096, 8),
         ("wo_b", 5120, 8192, 1), ("shared w13", 4608, 5120, 1), ("shared w2", 5120, 2304, 1)]


def layer_weights(g: torch.Generator) -> list[tuple]:
    """One V4.1 layer's FP8 GEMV weights on the CPU: (name, N, K, groups, q [N, K] e4m3, s UE8M0 [N/32, K/32]),
    random rows of norm ~1 quantised with [32, 32] blocks."""
    from deepinfer_core.kernels.ops.quant import quant_fp8_block

    out = []
    for name, n, k, groups in LAYER:
        q, s = quant_fp8_block(torch.randn(n, k, generator=g) / k ** 0.5, (32, 32), "ue8m0")
        out.append((name, n, k, groups, q, s))
    return out


def _ints(s: str) -> list[int]:
    return [int(v) for v in s.split(",") if v]


def check_gemv(dists: list[int], rows: list[int]) -> bool:
    from deepinfer_nvidia.kernels import gluon_fp8_gemv as gg
    from deepinfer_nvidia.kernels import triton_gemm as tg
    from deepinfer_nvidia.kernels.triton_norm import rms as nv_rms

    dev = torch.device("cuda")
    sms = tg._sm_count(dev)
    g = torch.Generator().manual_seed(0)
    weights = [(name, n, k, groups, q.cuda(), s.view(torch.uint8).contiguous().cuda())
               for name, n, k, groups, q, s in layer_weights(g)]
    layer_mb = sum(q.numel() + s.numel() for *_, q, s in weights) / 1e6
    copies = max(2, -(-300 // int(layer_mb)))  # > 300 MB of weights a replay: nothing stays in L2 (50 MB)
    ring = [[(q.clone(), s.clone()) for *_, q, s in weights] for _ in range(copies)]
    ok = True
    for m in rows:
        xs = {k * groups: torch.randn(m, k * groups, generator=g).bfloat16().cuda()
              for _, _, k, groups, _, _ in weights}
        normw = torch.ones(5120, dtype=torch.bfloat16, device=dev)
        x_norm_in = torch.randn(m, 5120, generator=g).bfloat16().cuda()

        def gemv(i, q, s, pf):
            _, n, k, groups, _, _ = weights[i]
            return gg.gemv_wgmma(xs[k * groups], q, s, s.shape[1], 32, 32, sms, ng=n // groups if groups > 1 else None,
                                 prefetch=pf)

        for i, (name, n, k, groups, q, s) in enumerate(weights):
            base = gemv(i, q, s, 0)
            for pf in dists:
                same = bool(torch.equal(gemv(i, q, s, pf), base))
                ok &= same
                eff = gg.launch_plan(m, n, k, sms, gg.WGMMA_GEMV_TUNE["stages"], prefetch=pf)[4]
                print(f"gemv {name:16s} [{n}x{k * groups}] M={m} prefetch {pf} (launch {eff}): bit-equal {same}",
                      flush=True)

        def layer(pf, with_norm):
            for copy in ring:
                for i, (q, s) in enumerate(copy):
                    if with_norm:
                        nv_rms(x_norm_in, normw, 1e-6)
                    gemv(i, q, s, pf)

        for with_norm in (False, True):
            how = "after an RMSNorm each" if with_norm else "back to back"
            line = f"layer GEMVs M={m} {how:22s} ({layer_mb:.0f} MB):"
            for pf in [0] + dists + [0]:
                us = graph_us(lambda: layer(pf, with_norm), warmup=5, rep=40) / copies
                line += f" pf{pf} {us:7.1f} us ({layer_mb / us:4.2f} TB/s)"
            print(line, flush=True)
    return ok


def check_swap(dists: list[int], tokens: list[int]) -> bool:
    import deepinfer_nvidia.kernels.gluon_moe_swap as sw
    import deepinfer_nvidia.kernels.gluon_swap_pair as gp
    from deepinfer_nvidia.tests.bench_swap import _packed

    g = torch.Generator(device="cuda").manual_seed(0)
    E, K, D, F = 384, 6, 5120, 2304
    ws = (*_packed(E, F, D, g), *_packed(E, F, D, g), *_packed(E, D, F, g))
    ok = True
    saved = gp.PAIR_L2_PREFETCH
    for t in tokens:
        x = torch.randn(t, D, generator=g, device="cuda").to(torch.bfloat16)
        ids = torch.rand(t, E, generator=g, device="cuda").topk(K, dim=1).indices
        w = torch.rand(t, K, generator=g, device="cuda")
        mb = torch.unique(ids).numel() * sum(a.numel() for a in ws) / E / 1e6
        gp.PAIR_L2_PREFETCH = 0
        base = sw.swap_mxfp4(x, w, ids, *ws, 10.0)
        line = f"swap T={t} ({mb:.0f} MB):"
        for pf in [0] + dists + [0]:
            gp.PAIR_L2_PREFETCH = pf
            same = bool(torch.equal(sw.swap_mxfp4(x, w, ids, *ws, 10.0), base))
            ok &= same
            us = graph_us(lambda: sw.swap_mxfp4(x, w, ids, *ws, 10.0), calls=4, warmup=5, rep=40)
            line += f" pf{pf} {us:6.1f} us ({mb / us:4.2f} TB/s{'' if same else ', UNEQUAL'})"
        print(line, flush=True)
    gp.PAIR_L2_PREFETCH = saved
    return ok


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gemv", default="4,6,8", help="GEMV prefetch distances (K tiles) besides 0")
    ap.add_argument("--swap", default="4,6,8", help="swap prefetch distances (steps) besides 0")
    ap.add_argument("--rows", default="1,8")
    ap.add_argument("--tokens", default="1,8")
    args = ap.parse_args()
    ok = check_gemv(_ints(args.gemv), _ints(args.rows)) if args.gemv else True
    ok &= check_swap(_ints(args.swap), _ints(args.tokens)) if args.swap else True
    print("prefetch check ok" if ok else "PREFETCH CHECK FAILED", flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
