"""Where a decode step's ops run, on the CPU: the main stream (the chain) or a ``stream.side`` branch.

    python benchmarks/chain_census.py [--layers-shown 2] [--quant fp4]

Loads the tiny V4.1 checkpoint (``deepinfer make-tiny`` layout, written to a temporary directory) with a recording
kernel table, prefills a short prompt, then records one decode step: every call of a resolved model op, and whether
it ran inside a ``stream.side`` branch. The reference platform runs a branch in place, so the order is the model's
program order; on nvidia the branches fork onto side streams and the main stream's ops are the batch-1 chain. The
linears' GEMMs hold their own kernels and are not counted. Environment knobs (``DEEPINFER_MHC_MIX_BRANCH=0``
and the like) change what it reports, so each opt-in's effect on the chain can be read without a GPU.
"""
from __future__ import annotations

import argparse
import collections
import tempfile
from pathlib import Path

import torch


def census(quant: str = "fp4", dtype: torch.dtype = torch.bfloat16) -> list[tuple[str, bool]]:
    """``[(op, in_branch), ...]`` of one decode step of the tiny V4.1 (after a 7-token prefill), in call order."""
    from deepinfer_core.runner.executor import PagedExecutor
    from deepinfer_core.runner.simple_driver import run_requests
    from deepinfer_models.deepseek_v41.checkpoint_writer import write_tiny_v41_checkpoint
    from deepinfer_models.deepseek_v41.loading import load_deepseek_v41

    with tempfile.TemporaryDirectory() as tmp:
        model = load_deepseek_v41(write_tiny_v41_checkpoint(Path(tmp) / "tiny", quant=quant), dtype=dtype)
    calls: list[tuple[str, bool]] = []
    state = {"depth": 0, "record": False}

    def wrap(name, fn):
        def run(*args, **kwargs):
            if name == "stream.side":  # the branch body runs with depth > 0, wherever the platform runs it
                body = args[0]

                def branch(*a, **kw):
                    state["depth"] += 1
                    try:
                        return body(*a, **kw)
                    finally:
                        state["depth"] -= 1
                return fn(branch, *args[1:], **kwargs)
            if state["record"]:
                calls.append((name, state["depth"] > 0))
            return fn(*args, **kwargs)
        return run

    for name in list(model.k):
        model.k[name] = wrap(name, model.k[name])
    ex = PagedExecutor(model, num_blocks=64, max_num_seqs=1)
    run = ex.run
    steps = []

    def recording_run(*args, **kwargs):
        steps.append(1)
        state["record"] = len(steps) == 2  # the decode step, after the prefill
        try:
            return run(*args, **kwargs)
        finally:
            state["record"] = False

    ex.run = recording_run
    prompt = list(range(1000, 1008))
    with torch.inference_mode():
        run_requests(ex, [prompt], [[(0, 7)], [(0, 1)]])
    return calls


def report(calls: list[tuple[str, bool]], layers_shown: int = 2) -> str:
    chain = [op for op, side in calls if not side]
    side = [op for op, side in calls if side]
    lines = [f"decode step: {len(chain)} ops on the main stream, {len(side)} in side branches",
             "main stream: " + ", ".join(f"{op} x{n}" for op, n in collections.Counter(chain).most_common()),
             "branches:    " + ", ".join(f"{op} x{n}" for op, n in collections.Counter(side).most_common())]
    # the first layers' stretch of the chain: up to the (layers_shown + 1)-th attention
    cut = [i for i, op in enumerate(chain) if op.startswith("attention.")][:layers_shown + 1]
    if cut:
        lines.append("chain order: " + " > ".join(chain[:cut[-1] + 1]))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quant", default="fp4", choices=("none", "fp8", "fp4"))
    ap.add_argument("--layers-shown", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(1)
    print(report(census(a.quant), a.layers_shown))


if __name__ == "__main__":
    main()
