"""Step timings for ``benchmarks/sweep.py``: synchronous steps, eager and graphed steps alternated,
pipelined steps (the next step packed while this one runs), one profiled step, a host-sync audit.

Every function takes the slice's model, a ``PagedExecutor`` (``ex``), the step's ``SeqSlice``s and its input
ids (a device tensor) and returns plain numbers (ms) for the sweep's JSON rows.
"""
from __future__ import annotations

import json
import os
import re
import statistics
import time
from pathlib import Path

import torch


def sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def log(msg: str) -> None:
    print(msg, flush=True)


def time_step(model, ex, slices, ids, last_only: bool, warmup: int, reps: int) -> dict[str, float]:
    def step():
        h = ex.run(ids, slices)
        return model.compute_logits(h[-1:] if last_only else h)

    for _ in range(warmup):
        step()
    sync()
    times, ctx_times = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    for _ in range(min(reps, 3)):
        t0 = time.perf_counter()
        ex.context(slices)
        sync()
        ctx_times.append(time.perf_counter() - t0)
    return {"ms": statistics.median(times) * 1e3, "ms_min": min(times) * 1e3,
            "metadata_ms": statistics.median(ctx_times) * 1e3}


LAUNCH_EVENTS = ("cudaLaunchKernel", "cuLaunchKernelEx", "cuLaunchKernel", "cudaLaunchKernelExC", "cudaGraphLaunch",
                 "cudaMemcpyAsync")


def profile_step(model, ex, slices, ids, last_only: bool, title: str, fh) -> dict:
    from torch.profiler import ProfilerActivity, profile

    def step():
        h = ex.run(ids, slices)
        return model.compute_logits(h[-1:] if last_only else h)

    step()
    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        t0 = time.perf_counter()
        step()
        sync()
        wall = time.perf_counter() - t0
    ka = prof.key_averages()
    dev_us = sum(getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0)) for e in ka)
    launches = {e.key: e.count for e in ka if e.key in LAUNCH_EVENTS}
    fh.write(f"\n=== {title}: wall {wall * 1e3:.2f} ms (profiled), GPU kernel time {dev_us / 1e3:.2f} ms, "
             f"launches {launches} ===\n")
    fh.write(ka.table(sort_by="self_device_time_total", row_limit=30) + "\n")
    fh.write(ka.table(sort_by="self_cpu_time_total", row_limit=15) + "\n")
    # the torch ops again by input shape: which copy_ / mm / elementwise call costs what
    fh.write(prof.key_averages(group_by_input_shape=True).table(sort_by="device_time_total", row_limit=30) + "\n")
    if os.environ.get("DEEPINFER_SWEEP_TRACE") == "1":  # the timeline: where the main stream waits
        from benchmarks.trace_chain import chain_report, format_report
        from benchmarks.trace_timeline import report as timeline_report

        path = Path(fh.name).with_name("trace_" + re.sub(r"[^A-Za-z0-9]+", "_", title).strip("_") + ".json")
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
        for rep in (lambda: format_report(chain_report(trace)), lambda: timeline_report(trace)):
            try:
                fh.write("\n" + rep() + "\n")
            except ValueError as exc:
                fh.write(f"\n{exc}\n")
    fh.flush()
    log(f"profile {title}: wall {wall * 1e3:.1f} ms, GPU busy {dev_us / 1e3:.1f} ms, launches {launches}")
    return {"profiled_wall_ms": wall * 1e3, "gpu_busy_ms": dev_us / 1e3, "launches": launches}


def time_ab(model, ex, slices, ids, graphs, reps: int) -> dict[str, float]:
    """Eager and graphed steps alternated (the same CPU conditions for both): medians and minima."""
    def step():
        h = ex.run(ids, slices)
        return model.compute_logits(h)

    times: dict[str, list[float]] = {"eager": [], "graphs": []}
    for _ in range(reps):
        for mode, g in (("eager", None), ("graphs", graphs)):
            ex.graphs = g
            sync()
            t0 = time.perf_counter()
            step()
            sync()
            times[mode].append(time.perf_counter() - t0)
    ex.graphs = graphs
    return {f"paired_{m}_ms": statistics.median(v) * 1e3 for m, v in times.items()} | \
        {f"paired_{m}_ms_min": min(v) * 1e3 for m, v in times.items()}


def sync_audit(model, ex, slices, ids) -> dict:
    """Every host synchronisation of one step: (file:line -> count) from torch's sync debug mode."""
    import warnings

    with torch.inference_mode():
        ex.run(ids, slices)
    sync()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with torch.inference_mode():
                h = ex.run(ids, slices)
                model.compute_logits(h[-1:])
        finally:
            torch.cuda.set_sync_debug_mode("default")
    sync()
    where: dict[str, int] = {}
    root = str(Path(__file__).resolve().parent.parent) + os.sep
    for w in caught:
        if "synchronizing CUDA operation" not in str(w.message):  # not the mode's own "prototype" warning
            continue
        key = f"{str(w.filename).replace(root, '')}:{w.lineno}"
        where[key] = where.get(key, 0) + 1
    return {"total": sum(where.values()), "where": dict(sorted(where.items(), key=lambda kv: -kv[1]))}


def time_pipelined(model, ex, slices, ids, steps: int = 20) -> dict[str, float]:
    """Decode steps chained on the device, as an engine with asynchronous scheduling runs them: each step's
    input ids are the previous step's greedy samples (``argmax`` of its logits, a device tensor), and the
    host packs and launches step N+1 while the device still runs step N (``DecodeGraphs.run`` takes device
    ids without reading them). Time per step = the wall time of ``steps`` chained steps / ``steps``: the
    host's time is hidden wherever the device's step is longer. Every step rewrites the same cache rows
    (the slices do not advance), as in ``time_step``."""
    def chain(n: int, first: torch.Tensor) -> torch.Tensor:
        nxt = first
        for _ in range(n):
            nxt = model.compute_logits(ex.run(nxt, slices)).argmax(dim=-1)
        return nxt

    with torch.inference_mode():
        chain(2, ids)
        sync()
        walls = []
        for _ in range(3):
            t0 = time.perf_counter()
            chain(steps, ids)
            sync()
            walls.append((time.perf_counter() - t0) / steps)
    return {"pipelined_ms": statistics.median(walls) * 1e3, "pipelined_ms_min": min(walls) * 1e3,
            "pipelined_steps": steps}
