"""Small per-step ops, Triton kernel against the torch reference on the GPU, at DeepSeek-V4.1 sizes (not a pytest file).

    python3 -m deepinfer_nvidia.tests.bench_small_ops [--out DIR]

``index.topk`` (k 512 over 1024 / 8192 compressed entries) and ``sample.topk_topp_minp`` (V 129280, all three
filters on, and top-p only) at batch 1, 8, 64, 256; when present, ``moe.route_topk`` (E 384, k 6) and
``compress.softmax_pool``. Each time is the median of ``do_bench`` over one CUDA-graph replay of the call
(launch overhead excluded), or of eager calls for a side that cannot be captured (printed as ``eager``); the
ratio is reference / kernel. Writes ``small_ops.json``.
"""
from __future__ import annotations

import argparse
import json
import os

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    from triton.testing import do_bench

    from deepinfer_core.kernels.ops.indexer import topk_positions
    from deepinfer_core.kernels.ops.sampling import topk_topp_minp
    from deepinfer_nvidia.graphs import CudaGraphRunner
    from deepinfer_nvidia.kernels import triton_sampling, triton_topk

    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)

    def graph_us(fn, *a):
        """(us, mode): one CUDA-graph replay; eager ``do_bench`` (launch overhead included) for a function that
        cannot be captured (the sampler's reference copies a host scalar)."""
        try:
            runner = CudaGraphRunner(fn)
            runner(*a)
            return do_bench(lambda: runner(*a), warmup=10, rep=50, return_mode="median") * 1e3, "graph"
        except RuntimeError:
            torch.cuda.synchronize()
            return do_bench(lambda: fn(*a), warmup=10, rep=50, return_mode="median") * 1e3, "eager"

    cases = []
    for b in (1, 8, 64, 256):
        for n in (1024, 8192):
            s = torch.randn(b, n, generator=g, device=dev)
            cases.append((f"index.topk B={b} N={n} k=512", topk_positions, triton_topk.topk_positions_triton,
                          (s, 512)))
        logits = torch.randn(b, 129280, generator=g, device=dev) * 3
        on = (torch.full((b,), 50, device=dev), torch.full((b,), 0.9, device=dev), torch.full((b,), 0.05, device=dev))
        p_only = (torch.zeros(b, dtype=torch.long, device=dev), torch.full((b,), 0.9, device=dev),
                  torch.zeros(b, device=dev))
        cases.append((f"sample.topk_topp_minp B={b} all on", topk_topp_minp, triton_sampling.topk_topp_minp,
                      (logits, *on)))
        cases.append((f"sample.topk_topp_minp B={b} top-p only", topk_topp_minp, triton_sampling.topk_topp_minp,
                      (logits, *p_only)))
    try:
        from deepinfer_core.kernels.ops.compress import softmax_pool
        from deepinfer_core.kernels.ops.moe import route_topk
        from deepinfer_nvidia.kernels import triton_compress, triton_route

        for t in (1, 64, 8192):
            lg = torch.randn(t, 384, generator=g, device=dev)
            bias = torch.randn(384, generator=g, device=dev) * 0.1
            cases.append((f"moe.route_topk T={t} E=384 k=6", route_topk, triton_route.route_topk, (lg, bias, 6, 2.5)))
        for n, s_, d in ((64, 4, 512), (4096, 4, 512), (64, 128, 512)):
            kv = torch.randn(n, s_, d, generator=g, device=dev).bfloat16()
            sc = torch.randn(n, s_, d, generator=g, device=dev)
            cases.append((f"compress.softmax_pool N={n} S={s_} d={d}", softmax_pool, triton_compress.softmax_pool,
                          (kv, sc)))
    except ImportError as exc:
        print(f"routing / compressor kernels not present: {exc}")
    rows = []
    for name, ref, fn, a in cases:
        try:
            (r_us, r_mode), (k_us, k_mode) = graph_us(ref, *a), graph_us(fn, *a)
        except Exception as exc:  # noqa: BLE001 - recorded
            rows.append({"case": name, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
            print(name, rows[-1]["error"], flush=True)
            continue
        rows.append({"case": name, "reference_us": r_us, "reference_mode": r_mode, "kernel_us": k_us,
                     "kernel_mode": k_mode, "speedup": r_us / k_us})
        print(f"{name:48s} reference {r_us:9.1f} us ({r_mode})  kernel {k_us:9.1f} us ({k_mode})  "
              f"{r_us / k_us:6.2f}x", flush=True)
    with open(os.path.join(args.out, "small_ops.json"), "w") as fh:
        json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
