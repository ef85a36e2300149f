"""How often a graph capture of the full-width V4.1 decode step fails, and where (thirteenth pass).

    python3 -m deepinfer_nvidia.tests.capture_probe [--rounds 2] [--batches 64,1,8,32]

Two captures of the 8-layer slice's decode step failed on the H200 with "operation failed due to a
previous error during capture" while the same steps captured in other processes. This builds the
slice once, then for each round and batch size sets up fresh caches and captures a new
``DecodeGraphs`` bucket from CPU input ids (as the engine does). Every failed attempt prints its full
traceback; ``CudaGraphRunner`` repeats a failed capture once, so the summary counts first attempts
that failed, retries that succeeded, and buckets left eager.
"""
from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batches", default="64,1,8,32")
    ap.add_argument("--context", type=int, default=4096)
    args = ap.parse_args()
    from benchmarks import sweep
    from benchmarks.sweep_slice import arch_config, build_weights
    from deepinfer_nvidia import graphs as nvg

    once = nvg.CudaGraphRunner._capture_once
    failures: list[str] = []

    def traced(self, a, kw):
        try:
            return once(self, a, kw)
        except Exception:
            failures.append(traceback.format_exc())
            print("capture attempt failed:\n" + failures[-1][-4000:], flush=True)
            raise

    nvg.CudaGraphRunner._capture_once = traced
    cfg = arch_config("v41", 8, [0], "fp4", engram_vocab=1 << 20)
    model = sweep.make_model(cfg, build_weights(cfg, "cuda"), "triton")
    summary = {"captures": 0, "first_attempt_failed": 0, "left_eager": 0}
    for r in range(args.rounds):
        for b in [int(v) for v in args.batches.split(",")]:
            ex, slices, ids = sweep.setup_step(model, cfg, b, args.context, 1, sweep.step_kernels("triton"))
            graphs = sweep.graph_steps(ex, b, args.context)
            ex.graphs = graphs
            with torch.inference_mode():
                h = ex.run(ids.cpu(), slices)
                model.compute_logits(h)
            torch.cuda.synchronize()
            summary["captures"] += 1
            summary["first_attempt_failed"] += graphs.graphed.failed_captures
            summary["left_eager"] += graphs.disabled_reason is not None
            print(f"round {r} batch {b}: failed attempts {graphs.graphed.failed_captures}, "
                  f"disabled: {graphs.disabled_reason}", flush=True)
            del ex, graphs, h
            torch.cuda.empty_cache()
    print("summary", summary, flush=True)


if __name__ == "__main__":
    main()
