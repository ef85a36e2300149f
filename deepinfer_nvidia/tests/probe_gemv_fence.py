"""Diagnostic (not a pytest file): does the FP8 wgmma GEMV's async-proxy fence a K tile hold it at one row?

    python -m deepinfer_nvidia.tests.probe_gemv_fence [--rows 1,4] [--xchunks 2,4]

ptxas lowers the fence to ``MEMBAR.ALL.CTA`` + ``FENCE.VIEW.ASYNC.S`` in the K loop of ``gluon_fp8_gemv``'s kernel,
as in the swap experts' (``probe_down_cap --fences``). For V4.1's batch-1 GEMV shapes ([N, K] e4m3, [32, 32] UE8M0
blocks) this times ``gemm.fp8_block`` (``triton_gemm.gemm_fp8_block``: the wgmma GEMV at these rows) from a CUDA
graph with the fence (as used), without it (``gluon_fp8_gemv.GEMV_PROBE_NO_FENCE``: not guaranteed correct) and with
the x tiles in chunks (``GEMV_X_CHUNK``: the fence once a chunk, the same bits), every variant twice in turn, and
compares each output with the fenced one's. The weight bytes over the time give each call's bandwidth.
"""
from __future__ import annotations

import argparse

import torch

from deepinfer_nvidia.tests.graph_timing import graph_us

# V4.1-Flash's batch-1 FP8 GEMVs: wq_a, wq_b, wo_b, the shared expert's w13 and w2, the Engram wkv
SHAPES = {"wq_a": (1280, 5120), "wq_b": (32768, 1280), "wo_b": (5120, 8192), "shared w13": (4608, 5120),
          "shared w2": (5120, 2304), "engram wkv": (25600, 6144)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,4")
    ap.add_argument("--xchunks", default="2,4")
    args = ap.parse_args()
    from deepinfer_core.kernels.ops.quant import quant_fp8_block
    from deepinfer_nvidia.kernels import gluon_fp8_gemv as gg
    from deepinfer_nvidia.kernels.triton_gemm import gemm_fp8_block

    g = torch.Generator().manual_seed(0)
    for name, (n, k) in SHAPES.items():
        q, s = quant_fp8_block(torch.randn(n, k, generator=g) / k ** 0.5, (32, 32), "ue8m0")
        q, s = q.cuda(), s.view(torch.uint8).contiguous().cuda()
        for m in [int(v) for v in args.rows.split(",")]:
            x = torch.randn(m, k, generator=g).bfloat16().cuda()
            variants = [("fence", False, 0), ("no fence", True, 0)]
            variants += [(f"xc {v}", False, int(v)) for v in args.xchunks.split(",") if v]
            line, outs = f"{name:11s} [{n}, {k}] rows {m}:", {}
            for label, bare, xc in variants + variants:
                gg.GEMV_PROBE_NO_FENCE, gg.GEMV_X_CHUNK = bare, xc
                outs.setdefault(label, gemm_fp8_block(x, q, s, (32, 32)))
                us = graph_us(lambda: gemm_fp8_block(x, q, s, (32, 32)), warmup=20, rep=100, mode="mean")
                line += f" | {label} {us:6.1f} us {n * k / us / 1e6:4.2f} TB/s"
            gg.GEMV_PROBE_NO_FENCE, gg.GEMV_X_CHUNK = False, 0
            same = {label: torch.equal(outs[label], outs["fence"]) for label in outs if label != "fence"}
            print(line + f" | same output as fenced: {same}", flush=True)

if __name__ == "__main__":
    main()
