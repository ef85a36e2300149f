"""Where the host time of a graphed decode step goes (thirteenth pass, docs/performance.md).

    python3 -m deepinfer_nvidia.tests.host_breakdown --out DIR [--batches 1,64] [--context 4096]

A graphed V4.1 decode step at batch 64 took 19.5 ms while the GPU was busy 17.8 ms (twelfth pass). This
script splits the wall time of the same step (the sweep's 8-layer full-width V4.1 slice, built by
``benchmarks/sweep.py``'s helpers) into its host pieces, each timed with ``perf_counter`` around the
call that runs it:

- ``prep``: ``DecodeGraphs``'s bucket choice and ``pack`` (padding, ``pack_step``: Python);
- ``upload``: the packed tensor staged through pinned memory and copied (asynchronous);
- ``copy_in``: the graph runner's signature lookup and the copy into the static input;
- ``launch``: ``CUDAGraph.replay()`` itself (the CPU cost of launching every node);
- ``logits``: launching the logits GEMM;
- ``wait``: the synchronisation at the end (GPU work left after the host is done).

It also times the replay alone (``replay + sync``), back-to-back replays (the GPU time when launches
overlap execution) and the GPU time between events around one replay. A synthetic part measures the
launch cost of graphs of N trivial kernels (per-node cost of this driver) and whether splitting one graph
into 4 shortens the step (one graph of 800 small kernels against the same work as 4 graphs of 200).
Writes ``host_breakdown.json``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def _ms(x: float) -> float:
    return round(x * 1e3, 4)


def synthetic(results: dict) -> None:
    """Launch cost of graphs of N small kernels, and whether execution overlaps the launch call."""
    x = torch.zeros(1024, device="cuda")
    rows = []
    for n in (100, 400, 800, 1600):
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            x.add_(1)
        torch.cuda.synchronize()
        with torch.cuda.graph(g):
            for _ in range(n):
                x.add_(1)
        g.replay()
        torch.cuda.synchronize()
        launch, wall = [], []
        for _ in range(20):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            g.replay()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            launch.append(t1 - t0)
            wall.append(t2 - t0)
        rows.append({"nodes": n, "launch_ms": _ms(statistics.median(launch)), "wall_ms": _ms(statistics.median(wall)),
                     "us_per_node": round(statistics.median(launch) * 1e6 / n, 3)})
        print(f"synthetic add_ x{n}: launch {rows[-1]['launch_ms']} ms ({rows[-1]['us_per_node']} us/node), "
              f"wall {rows[-1]['wall_ms']} ms", flush=True)
        del g
    results["synthetic_launch"] = rows
    # ~20 us kernels: one graph of n against 4 graphs of n/4 launched in a row
    a = torch.randn(4 << 20, device="cuda")
    n = 800

    def body(k: int) -> None:
        for _ in range(k):
            torch.sin(a, out=a)

    one = torch.cuda.CUDAGraph()
    with torch.cuda.graph(one):
        body(n)
    parts = []
    for _ in range(4):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=one.pool()):
            body(n // 4)
        parts.append(g)
    for g in [one] + parts:
        g.replay()
    torch.cuda.synchronize()

    def timed(fn) -> tuple[float, float]:
        walls, gpus = [], []
        for _ in range(10):
            torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            e0.record()
            fn()
            e1.record()
            torch.cuda.synchronize()
            walls.append(time.perf_counter() - t0)
            gpus.append(e0.elapsed_time(e1) / 1e3)
        return statistics.median(walls), statistics.median(gpus)

    w1, g1 = timed(one.replay)
    w4, g4 = timed(lambda: [g.replay() for g in parts])
    results["synthetic_split"] = {"kernels": n, "one_graph_wall_ms": _ms(w1), "one_graph_gpu_ms": _ms(g1),
                                  "four_graphs_wall_ms": _ms(w4), "four_graphs_gpu_ms": _ms(g4)}
    print(f"synthetic split: {results['synthetic_split']}", flush=True)


def slice_breakdown(args, results: dict) -> None:
    from benchmarks import sweep
    from benchmarks.sweep_slice import arch_config, build_weights
    from deepinfer_core.runner.context import upload
    from deepinfer_nvidia.graphs import _signature

    cfg = arch_config("v41", args.layers, [0], "fp4", engram_vocab=1 << 20)
    weights = build_weights(cfg, "cuda")
    model = sweep.make_model(cfg, weights, "triton")
    for b in [int(v) for v in args.batches.split(",")]:
        ex, slices, ids = sweep.setup_step(model, cfg, b, args.context, 1, sweep.step_kernels("triton"))
        ids_cpu = ids.cpu()
        graphs = sweep.graph_steps(ex, b, args.context)
        ex.graphs = graphs
        with torch.inference_mode():
            for _ in range(3):
                model.compute_logits(ex.run(ids_cpu, slices))
        torch.cuda.synchronize()
        runner = graphs.graphed
        (captured,) = runner._graphs.values()
        parts: dict[str, list[float]] = {k: [] for k in ("prep", "upload", "copy_in", "launch", "logits", "wait",
                                                         "total")}
        with torch.inference_mode():
            for _ in range(args.reps):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                # the body of DecodeGraphs.run / _replay, split at each host piece
                b_pad, ctx_len = graphs.bucket(slices)
                host, layout = graphs.pack(slices, [int(t) for t in ids_cpu.tolist()], b_pad, ctx_len)
                t1 = time.perf_counter()
                dev = upload(host, ex.device)
                t2 = time.perf_counter()
                _signature((dev,), {"layout": layout})
                captured.args[0].copy_(dev)
                t3 = time.perf_counter()
                captured.graph.replay()
                t4 = time.perf_counter()
                model.compute_logits(captured.out[:b])
                t5 = time.perf_counter()
                torch.cuda.synchronize()
                t6 = time.perf_counter()
                for k, (u, v) in zip(("prep", "upload", "copy_in", "launch", "logits", "wait", "total"),
                                     ((t0, t1), (t1, t2), (t2, t3), (t3, t4), (t4, t5), (t5, t6), (t0, t6))):
                    parts[k].append(v - u)
            steps = []
            for _ in range(args.reps):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                model.compute_logits(ex.run(ids_cpu, slices))
                torch.cuda.synchronize()
                steps.append(time.perf_counter() - t0)
            replay, gpu = [], []
            for _ in range(args.reps):
                torch.cuda.synchronize()
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                t0 = time.perf_counter()
                e0.record()
                captured.graph.replay()
                e1.record()
                torch.cuda.synchronize()
                replay.append(time.perf_counter() - t0)
                gpu.append(e0.elapsed_time(e1) / 1e3)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(10):
                captured.graph.replay()
            torch.cuda.synchronize()
            b2b = (time.perf_counter() - t0) / 10
        row = {"batch": b, "context": args.context, "step_ms": _ms(statistics.median(steps)),
               **{f"{k}_ms": _ms(statistics.median(v)) for k, v in parts.items()},
               "replay_sync_ms": _ms(statistics.median(replay)), "replay_gpu_events_ms": _ms(statistics.median(gpu)),
               "replay_back_to_back_ms": _ms(b2b)}
        print(json.dumps(row), flush=True)
        results.setdefault("slice", []).append(row)
        ex.graphs = None
        del graphs, ex, captured, runner
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--skip-synthetic", action="store_true")
    args = ap.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    results: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                     "cuda": torch.version.cuda}
    if not args.skip_synthetic:
        synthetic(results)
    slice_breakdown(args, results)
    with open(Path(args.out) / "host_breakdown.json", "w") as fh:
        json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
