"""FlashMLA and DeepGEMM providers against the Triton ones, same shapes, same run (not a pytest file).

    python3 -m deepinfer_nvidia.tests.bench_vendors [--out DIR]

NEVER RUN in this project (no machine here has either library; ``docs/vendor_kernels.md``). Each case prints the
vendor time, the Triton time, their ratio, and the largest difference between the two outputs; a library that does
not import, or a device it does not serve (``supports`` false), is reported and skipped. Shapes are V4.1-Flash
widths: attention 64 heads of 512 over a 128-slot window plus 512 selected rows (and the window alone), at 1, 64
and 4096 query rows; FP8 linears [1024, 5120] and [5120, 1024] at 1, 64 and 4096 rows; the routed experts
(384 of 2304 x 5120, top 6) at 8192 tokens, the size DeepGEMM's grouped GEMM is taken at. Times are CUDA-graph
replays of ``RING`` back-to-back calls (``graph_timing.graph_us``). Writes ``vendors.json``.
"""
from __future__ import annotations

import argparse
import json
import os

import torch

from deepinfer_nvidia.tests.graph_timing import graph_us

RING = 10


def _row(name, vendor_fn, triton_fn, supported: bool, rows: list) -> None:
    if not supported:
        print(f"{name}: not taken by the vendor provider on this device / install; skipped")
        return
    a, b = vendor_fn(), triton_fn()
    diff = (a.float() - b.float()).abs().max().item()
    tv, tt = graph_us(vendor_fn, calls=RING), graph_us(triton_fn, calls=RING)
    rows.append(dict(case=name, vendor_us=tv, triton_us=tt, ratio=tt / tv, max_abs_diff=diff))
    print(f"{name}: vendor {tv:.1f} us, triton {tt:.1f} us, triton/vendor {tt / tv:.2f}x, max |diff| {diff:.3g}")


def attention(rows: list) -> None:
    from deepinfer_nvidia.kernels import flashmla, triton_attention

    g = torch.Generator(device="cuda").manual_seed(0)
    h, d, s = 64, 512, 1 << 16
    kva = torch.randn(s, d, device="cuda", dtype=torch.bfloat16, generator=g)
    kvb = torch.randn(s, d, device="cuda", dtype=torch.bfloat16, generator=g)
    for t in (1, 64, 4096):
        for nb in (512, 0):
            q = torch.randn(t, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
            ia = torch.randint(0, s, (t, 128), device="cuda", generator=g)
            ib = torch.randint(0, s, (t, nb), device="cuda", generator=g) if nb else None
            sinks = torch.randn(h, device="cuda", generator=g)
            args = (q, kva, ia, kvb if nb else None, ib, sinks, d ** -0.5)
            _row(f"attention T={t} slots=128+{nb}", lambda: flashmla.sparse_sink(*args),
                 lambda: triton_attention.sparse_sink(*args), flashmla.supports(*args), rows)


def linears_and_experts(rows: list) -> None:
    from deepinfer_core.kernels.ops.quant import quant_fp8_block, quant_mxfp4
    from deepinfer_nvidia.kernels import deepgemm, triton_gemm, triton_moe

    g = torch.Generator().manual_seed(1)
    for n, k in ((1024, 5120), (5120, 1024)):
        wq, ws = (t.cuda() for t in quant_fp8_block(torch.randn(n, k, generator=g) * 0.02, (128, 128),
                                                    scale_fmt="ue8m0"))
        for t in (1, 64, 4096):
            x = torch.randn(t, k, generator=g).bfloat16().cuda()
            _row(f"fp8 linear {n}x{k} T={t}", lambda: deepgemm.gemm_fp8_block(x, wq, ws, (128, 128)),
                 lambda: triton_gemm.gemm_fp8_block(x, wq, ws, (128, 128)),
                 deepgemm.supports_fp8(x, wq, ws, (128, 128)), rows)
    e, f, d, t, top = 384, 2304, 5120, 8192, 6
    one = [quant_mxfp4(torch.randn(r, c, generator=g) * 0.02) for r, c in ((f, d), (f, d), (d, f))]
    stacks = []
    for p, s in one:  # one expert's bytes repeated: the kernels' speed does not depend on the values
        stacks += [p.cuda().expand(e, *p.shape).contiguous(), s.cuda().expand(e, *s.shape).contiguous()]
    x = torch.randn(t, d, generator=g).bfloat16().cuda()
    ids = torch.stack([torch.randperm(e, generator=g)[:top] for _ in range(t)]).cuda()
    w = torch.rand(t, top, generator=g).cuda()
    args = (x, w, ids, *stacks, 7.0)
    _row(f"experts mxfp4 T={t}", lambda: deepgemm.moe_experts_mxfp4(*args),
         lambda: triton_moe.moe_experts_mxfp4(*args), deepgemm.supports_experts(*args), rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".")
    out = ap.parse_args().out
    print(f"device {torch.cuda.get_device_name()} sm{''.join(map(str, torch.cuda.get_device_capability()))}")
    rows: list = []
    attention(rows)
    linears_and_experts(rows)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "vendors.json"), "w") as fh:
        json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
