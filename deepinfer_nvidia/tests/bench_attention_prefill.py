"""Prefill launches of ``attention.sparse_sink`` at V4.1 widths on the GPU (not a pytest file; sixteenth pass).

    python -m deepinfer_nvidia.tests.bench_attention_prefill [--out DIR] [--tokens 8192]
        [--variants 64x32x8x0,...]   block_h x block_n x warps x stages

One query token per row with 64 heads x 512 dims attends to a sliding window of 128 rows and 512 selected
compressed rows (the ratio-1 / ratio-2 layers' shape at 8k). Each variant: max abs error against the default
launch (the module's own choice, timed as the first row) (any above 2e-2 prints FAIL and the run exits 1), median time (``do_bench``) and TFLOP/s counted as
4 * T * H * (Na + Nb) * D. Writes ``attention_prefill.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--tokens", default="8192")
    ap.add_argument("--variants", default="64x32x8x3,64x64x8x2,64x64x8x3,64x128x8x1")
    args = ap.parse_args()
    from triton.testing import do_bench

    from deepinfer_nvidia.kernels.triton_attention import sparse_sink

    os.makedirs(args.out, exist_ok=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    h, d, na, nb = 64, 512, 128, 512
    rows, failed = [], False
    for t in (int(v) for v in args.tokens.split(",")):
        sa, sb = t + 128, max(4096, t // 2)
        q = torch.randn(t, h, d, generator=g, device="cuda").bfloat16()
        kva = torch.randn(sa, d, generator=g, device="cuda").bfloat16()
        kvb = torch.randn(sb, d, generator=g, device="cuda").bfloat16()
        # the window: each token's last 128 positions (the first tokens' earlier rows are -1)
        pos = torch.arange(t, device="cuda")[:, None] - torch.arange(na - 1, -1, -1, device="cuda")[None, :]
        ia = torch.where(pos >= 0, pos, torch.full_like(pos, -1))
        ib = torch.randint(0, sb, (t, nb), generator=g, device="cuda")
        sinks = torch.randn(h, generator=g, device="cuda")
        base = sparse_sink(q, kva, ia, kvb, ib, sinks, d ** -0.5)
        flop = 4 * t * h * (na + nb) * d
        for v in ["default"] + args.variants.split(","):
            if v == "default":
                kw = {}
            else:
                bh, bn, warps, stages = (int(x) for x in v.split("x"))
                kw = dict(block_h=bh, block_n=bn, warps=warps, stages=stages)
            try:
                out = sparse_sink(q, kva, ia, kvb, ib, sinks, d ** -0.5, **kw)
                err = (out.float() - base.float()).abs().max().item()
                ms = do_bench(lambda: sparse_sink(q, kva, ia, kvb, ib, sinks, d ** -0.5, **kw), warmup=5, rep=40)
            except Exception as exc:  # out of shared memory / registers for this tile: reported, not fatal
                print(f"T={t} {v:<12} failed to launch: {type(exc).__name__}: {str(exc)[:160]}", flush=True)
                continue
            ok = err <= 2e-2
            failed |= not ok
            rows.append({"t": t, "variant": v, "ms": ms, "tflops": flop / ms / 1e9, "err": err})
            print(f"T={t} {v:<12} {ms:8.3f} ms  {flop / ms / 1e9:6.0f} TFLOP/s  err {err:.1e}"
                  f"{'' if ok else '  FAIL'}", flush=True)
    with open(os.path.join(args.out, "attention_prefill.json"), "w") as fh:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, fh, indent=1)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
