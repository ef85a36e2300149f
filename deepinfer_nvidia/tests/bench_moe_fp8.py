"""Tile sweep of the grouped FP8 routed experts (``triton_moe_fp8``) at V4-Flash widths (GPU; not a pytest file).

    python -m deepinfer_nvidia.tests.bench_moe_fp8 [--out DIR] [--tokens 1,8,64,1024,4096,8192]
        [--decode-variants 64x4x3x64,...] [--prefill-variants 128x8x3x64,...]   (block_n x warps x stages x max K tile)

256 experts, top-6, D=4096, F=2048, e4m3 weights with fp32 [128, 128] block scales (the V4-Flash-Base layout),
uniform random routing. For each token count, every variant (``TUNE``'s entry for the BLOCK_M that
``block_m_for`` picks is the first) is replayed from one CUDA graph per call (median of ``do_bench``). Bytes =
the distinct routed experts' weights and scales, shown as a fraction of the copy bandwidth measured in the same
run. Every variant's output is compared with the default's (relative error < 1e-2), and the default's with
the core reference ``moe.experts_fp8`` at 8 tokens. Writes ``moe_fp8_bench.json``.
"""
from __future__ import annotations

import argparse
import json
import os

import torch

E, K_TOP, D, F, BLK, LIMIT = 256, 6, 4096, 2048, 128, 10.0


def _weights(g: torch.Generator, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[E, n, k] e4m3 codes (randn, built 16 experts at a time) and fp32 scales [E, n/128, k/128] ~ 1/sqrt(k)."""
    q = torch.empty(E, n, k, dtype=torch.float8_e4m3fn, device="cuda")
    for e0 in range(0, E, 16):
        q[e0:e0 + 16] = torch.randn(16, n, k, generator=g, device="cuda", dtype=torch.bfloat16).to(q.dtype)
    s = torch.rand(E, n // BLK, k // BLK, generator=g, device="cuda") * (1.5 / k ** 0.5) + 0.25 / k ** 0.5
    return q, s


def _variants(text: str) -> list[tuple[int, int, int, int]]:
    return [tuple(int(v) for v in s.split("x")) for s in text.split(",") if s]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--tokens", default="1,8,64,1024,4096,8192")
    ap.add_argument("--decode-variants", default="64x4x3x64,32x4x3x64,64x4x4x64,64x4x5x64,32x4x4x128,64x4x3x128,"
                    "64x4x4x128,128x4x3x64", help="BLOCK_M 16 (block_n x warps x stages x max K tile)")
    ap.add_argument("--prefill-variants", default="128x8x3x64,128x8x3x128,128x8x4x64,64x4x3x128,128x4x3x64,"
                    "256x8x3x64", help="BLOCK_M 32 and 64")
    args = ap.parse_args()
    from triton.testing import do_bench

    from deepinfer_core.kernels.ops.moe import experts_fp8
    from deepinfer_nvidia.graphs import CudaGraphRunner
    from deepinfer_nvidia.kernels import triton_moe_fp8 as mf
    from deepinfer_nvidia.kernels.triton_moe import block_m_for

    big = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    copy_bw = 2 * big.numel() / (do_bench(lambda: big.clone(), warmup=5, rep=50, return_mode="median") * 1e-3)
    del big
    print(f"copy bandwidth {copy_bw / 1e12:.2f} TB/s", flush=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    (w1, s1), (w3, s3), (w2, s2) = _weights(g, F, D), _weights(g, F, D), _weights(g, D, F)
    block = (BLK, BLK)
    expert_bytes = 3 * F * D + 4 * (s1[0].numel() + s3[0].numel() + s2[0].numel())
    results = []
    for t in [int(v) for v in args.tokens.split(",") if v]:
        x = torch.randn(t, D, generator=g, device="cuda", dtype=torch.bfloat16)
        ids = torch.rand(t, E, generator=g, device="cuda").argsort(dim=1)[:, :K_TOP].to(torch.int32)
        wts = torch.rand(t, K_TOP, generator=g, device="cuda")
        wts = wts / wts.sum(dim=1, keepdim=True)
        bm = block_m_for(t * K_TOP, E)
        wbytes = int(ids.unique().numel()) * expert_bytes
        default = mf.TUNE.get(bm, (64, 4, 3, mf.MAX_BLOCK_K))
        cands = [default] + [v for v in _variants(args.decode_variants if bm == 16 else args.prefill_variants)
                             if v != default]
        base = None
        row = {"tokens": t, "block_m": bm, "bytes": wbytes, "us": {}}
        for bn, nw, ns, mk in cands:
            label = f"{bn}x{nw}x{ns}x{mk}"

            def call(a, bn=bn, nw=nw, ns=ns, mk=mk):
                return mf.grouped_fp8(a, wts, ids, w1, s1, w3, s3, w2, s2, block, LIMIT, block_m=bm, block_n=bn,
                                      warps=nw, stages=ns, max_k=mk)
            try:
                out = call(x).float()
                if base is None:
                    base = out
                    if t == 8:
                        ref = experts_fp8(x.float(), wts, ids, w1, s1, w3, s3, w2, s2, block, LIMIT)
                        rel_ref = float((out - ref).norm() / ref.norm())
                        print(f"T={t} default vs core reference: rel {rel_ref:.1e}", flush=True)
                        assert rel_ref < 2e-2, rel_ref
                rel = float((out - base).norm() / base.norm())
                assert rel < 1e-2 and torch.isfinite(out).all(), (label, rel)
                runner = CudaGraphRunner(call)
                runner(x)
                us = do_bench(lambda: runner(x), warmup=10, rep=60, return_mode="median") * 1e3
            except Exception as exc:  # noqa: BLE001 - a variant that does not fit (shared memory) is recorded
                row["us"][label] = f"error: {type(exc).__name__}: {str(exc)[:160]}"
                print(f"T={t} bm={bm} {label}: {row['us'][label]}", flush=True)
                continue
            row["us"][label] = us
            print(f"T={t} bm={bm} {label}: {us:.1f} us, "
                  f"{100 * wbytes / (us * 1e-6) / copy_bw:.0f}% of copy BW; rel {rel:.1e}", flush=True)
        timed = {k: v for k, v in row["us"].items() if isinstance(v, float)}
        if timed:
            best = min(timed, key=timed.get)
            dlabel = "x".join(map(str, default))
            print(f"T={t}: default {dlabel} {timed.get(dlabel, float('nan')):.1f} us, best {best} "
                  f"{timed[best]:.1f} us", flush=True)
        results.append(row)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "moe_fp8_bench.json"), "w") as f:
        json.dump({"copy_bw": copy_bw, "rows": results}, f, indent=1)


if __name__ == "__main__":
    main()
