"""``index.scores`` at prefill sizes: the per-token kernel against the token-tiled one (fourteenth pass; not a
pytest file).

    python3 -m deepinfer_nvidia.tests.bench_indexer [--out DIR] [--ratio 4] [--slots 4096]
        [--variants 2x64x16x4,...]   tokens per program x candidates per chunk x chunks per program x warps

V4.1 widths (64 heads of 128, bf16 keys in paged slots): one sequence of 8192 tokens and two of 4096 in one
call (compression ratio ``--ratio``, 4 by default: token i sees its sequence's first (i+1)//ratio slots, N = the
longest list; V4.1's ratio-1 index sources: ``--ratio 1 --slots 8192``). Each
tiled variant (tokens per program, candidates per chunk, chunks per program; ``docs/perf/pass14c`` also has
the first tiled form, with its checks inside the loop) is checked against the per-token kernel on
every score and against the fp64 reference on 64 rows, then timed with ``do_bench`` (median, ms). Writes
``indexer.json``.
"""
from __future__ import annotations

import argparse
import json
import os

import torch


def causal_cand(lengths: list[int], ratio: int, slots: int, g: torch.Generator) -> torch.Tensor:
    """[sum(lengths), max N] int64: each sequence's slot list (random distinct slots), -1 past what a token sees."""
    n = max(lengths) // ratio
    rows = []
    for length in lengths:
        lst = torch.randperm(slots, generator=g)[:n]
        vis = (torch.arange(length) + 1) // ratio
        c = lst[None, :].expand(length, n).clone()
        c[torch.arange(n)[None, :] >= vis[:, None]] = -1
        rows.append(c)
    return torch.cat(rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--ratio", type=int, default=4)
    ap.add_argument("--slots", type=int, default=4096)
    ap.add_argument("--variants", default="2x64x16x4,2x64x8x4,2x64x32x4,2x32x16x4")
    args = ap.parse_args()
    from triton.testing import do_bench

    from deepinfer_core.kernels.ops.indexer import indexer_scores
    from deepinfer_nvidia.kernels import triton_indexer as ti
    from deepinfer_nvidia.kernels import triton_indexer_tiled as tt

    g = torch.Generator().manual_seed(0)
    h, d, slots = 64, 128, args.slots
    rows = []
    for lengths in ([8192], [4096, 4096]):
        cand = causal_cand(lengths, args.ratio, slots, g).cuda()
        t, n = cand.shape
        q = torch.randn(t, h, d, generator=g).bfloat16().cuda()
        w = (torch.randn(t, h, generator=g) * 0.02).cuda()
        keys = torch.randn(slots, d, generator=g).bfloat16().cuda()
        base = ti.scores_per_token(q, w, keys, cand, 1.0)
        pick = torch.randint(0, t, (64,), generator=g).cuda()
        ref = indexer_scores(q[pick], w[pick], keys, cand[pick], 1.0)
        torch.testing.assert_close(base[pick], ref, atol=2e-2, rtol=2e-2)
        row = {"lengths": lengths, "N": n, "per_token_ms": do_bench(lambda: ti.scores_per_token(q, w, keys, cand, 1.0),
                                                                     warmup=5, rep=50, return_mode="median")}
        variants = {f"tiled_bt{bt}_bn{bn}_c{c}_w{wp}": dict(bt=bt, block_n=bn, chunks=c, warps=wp)
                    for bt, bn, c, wp in (map(int, v.split("x")) for v in args.variants.split(","))}
        for name, kw in variants.items():
            out = torch.full_like(base, float("nan"))
            try:
                tt.launch(q, w, keys, cand, out, 1.0, "tf32", **kw)
                torch.testing.assert_close(out, base, atol=2e-2, rtol=2e-2)
                torch.testing.assert_close(out[pick], ref, atol=2e-2, rtol=2e-2)
                row[name + "_ms"] = do_bench(lambda: tt.launch(q, w, keys, cand, out, 1.0, "tf32", **kw),
                                             warmup=5, rep=50, return_mode="median")
            except Exception as exc:  # a variant that does not compile or disagrees: recorded, not fatal
                row[name + "_ms"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        rows.append(row)
        print(json.dumps(row), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "indexer.json"), "w") as fh:
        json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
