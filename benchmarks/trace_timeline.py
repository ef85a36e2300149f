"""A profiled step's kernels in start order, across all streams: where the GPU idles and where torch glue runs.

    python benchmarks/trace_timeline.py TRACE.json[.gz] [--glue-run 3] [--top 12] [--list FROM_US:TO_US]

``benchmarks/trace_chain.py`` follows the stream with the most kernels, which is the chain of an eager step. A CUDA
graph replay spreads its kernels over one stream per branch of the captured DAG (~25 in a V4.1 decode step), so
there is no main stream to follow. This report does not need one (forty-second pass, ``docs/perf/pass42a``):

- the span, the time some kernel runs (the union of the kernels' intervals) and the idle time, with the longest
  idle gaps;
- the kernel families by total time (the name up to its first ``<`` or ``(``);
- the glue runs: stretches of at least ``--glue-run`` consecutive torch kernels (``at::native`` /
  ``elementwise``), in start order, with where they start, how long they span and how many launches they hold.
  At batch 1 each is a chain of ~1.5-2 us launches of index math;
- the critical chain, estimated from the timestamps alone (``critical_chain``: each kernel's latest finisher
  before it), with its kernels' time, the waits between them and its families (forty-third pass): what a change
  must shorten to shorten the step;
- with ``--list``, every kernel starting in a window: start, duration, stream, grid, name.

``sweep_timing.profile_step`` appends this report to ``profile.txt`` for each trace it writes
(``DEEPINFER_SWEEP_TRACE=1``).
"""
from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere


class Kernel(NamedTuple):
    start: float  # us, from the first kernel's start
    end: float
    name: str
    stream: int
    grid: tuple

    @property
    def dur(self) -> float:
        return self.end - self.start


def load_trace(path: str | Path) -> dict:
    """A chrome trace (``.json`` or ``.json.gz``)."""
    p = Path(path)
    with (gzip.open(p, "rt") if p.suffix == ".gz" else open(p)) as fh:
        return json.load(fh)


def kernels(trace: dict) -> list[Kernel]:
    """The trace's kernel events in start order, times relative to the first start."""
    raw = []
    for ev in trace.get("traceEvents", []):
        if ev.get("cat") != "kernel" or ev.get("ph") != "X":
            continue
        args = ev.get("args") or {}
        ts, dur = float(ev["ts"]), float(ev.get("dur", 0.0))
        raw.append((ts, ts + dur, ev.get("name", "?"), int(args.get("stream", ev.get("tid", 0)) or 0),
                    tuple(args.get("grid", ()))))
    if not raw:
        raise ValueError("trace_timeline: no kernel events in the trace (was CUDA activity recorded?)")
    raw.sort()
    t0 = raw[0][0]
    return [Kernel(s - t0, e - t0, n, st, g) for s, e, n, st, g in raw]


def family(name: str) -> str:
    """A kernel's family: its name up to the first template or argument list (``void`` dropped)."""
    name = re.sub(r"^void ", "", name)
    return re.split(r"[<(]", name, maxsplit=1)[0].strip() or name


def is_glue(name: str) -> bool:
    """A torch (ATen) elementwise / index kernel: the step's index math and small copies."""
    return "at::native" in name or "elementwise" in name


def idle_gaps(ks: list[Kernel]) -> tuple[float, list[tuple[float, float]]]:
    """(time some kernel runs, [(gap start, gap length)] where none does), over the step's span."""
    busy, gaps = 0.0, []
    cur_s, cur_e = ks[0].start, ks[0].end
    for k in ks[1:]:
        if k.start > cur_e:
            busy += cur_e - cur_s
            gaps.append((cur_e, k.start - cur_e))
            cur_s, cur_e = k.start, k.end
        else:
            cur_e = max(cur_e, k.end)
    busy += cur_e - cur_s
    return busy, gaps


def glue_runs(ks: list[Kernel], min_run: int) -> list[tuple[float, float, int]]:
    """[(start, span, launches)] of the maximal runs of ``min_run`` or more consecutive glue kernels."""
    runs, cur = [], []
    for k in ks + [Kernel(float("inf"), float("inf"), "end", 0, ())]:
        if is_glue(k.name):
            cur.append(k)
            continue
        if len(cur) >= min_run:
            runs.append((cur[0].start, max(c.end for c in cur) - cur[0].start, len(cur)))
        cur = []
    return runs


def critical_chain(ks: list[Kernel], slack: float = 0.5, same_stream: float = 2.0) -> list[Kernel]:
    """An estimate of the step's critical chain, first kernel first: from the kernel that ends last, each step back
    takes what this kernel most likely waited on among the kernels that ended at or before its start (``slack`` us
    of tolerance for the clocks): the latest of them on its own stream (an order the stream enforces) when that
    ended within ``same_stream`` us of the latest of all, else the latest of all (a join of another branch). A trace
    has no dependency edges, so this is a reading of the timestamps, not a proof: a kernel of another branch that
    finished just before by chance can take a real dependency's place. Read it with PDL off (with PDL a dependent
    kernel starts early and waits inside, so its start says nothing about its inputs)."""
    cur = max(ks, key=lambda k: k.end)
    chain = [cur]
    while True:
        before = [k for k in ks if k.end <= cur.start + slack and k.start < cur.start]
        if not before:
            break
        latest = max(before, key=lambda k: k.end)
        own = [k for k in before if k.stream == cur.stream]
        own_latest = max(own, key=lambda k: k.end) if own else None
        cur = own_latest if own_latest is not None and latest.end - own_latest.end <= same_stream else latest
        chain.append(cur)
    return chain[::-1]


def chain_lines(ks: list[Kernel], top: int) -> list[str]:
    """The critical chain's summary: its kernels' time, the waits between them, its families by time."""
    chain = critical_chain(ks)
    run = sum(k.dur for k in chain)
    waits = sum(max(0.0, b.start - a.end) for a, b in zip(chain, chain[1:]))
    fams: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for k in chain:
        fams[family(k.name)][0] += k.dur
        fams[family(k.name)][1] += 1
    lines = [f"  critical chain (estimated from the timestamps, critical_chain): {len(chain)} kernels, "
             f"{run:.1f} us running, {waits:.1f} us between them; by family (us, launches):"]
    for name, (us, n) in sorted(fams.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"    {us:9.1f} {n:5d}  {name[:70]}")
    return lines


def report(trace: dict, glue_run: int = 3, top: int = 12, window: tuple[float, float] | None = None) -> str:
    ks = kernels(trace)
    span = max(k.end for k in ks)
    busy, gaps = idle_gaps(ks)
    fams: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for k in ks:
        fams[family(k.name)][0] += k.dur
        fams[family(k.name)][1] += 1
    glue = [k for k in ks if is_glue(k.name)]
    runs = glue_runs(ks, glue_run)
    lines = [f"timeline: {len(ks)} kernels on {len({k.stream for k in ks})} streams over {span:.1f} us; "
             f"some kernel runs {busy:.1f} us, none {span - busy:.1f} us in {len(gaps)} gaps; "
             f"torch glue: {len(glue)} launches, {sum(k.dur for k in glue):.1f} us of kernel time"]
    lines.append("  kernel families by time (us, launches):")
    for name, (us, n) in sorted(fams.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"    {us:9.1f} {n:5d}  {name[:70]}")
    lines.append(f"  glue runs of {glue_run}+ launches (start us, span us, launches): "
                 f"{sum(r[1] for r in runs):.1f} us in {len(runs)} runs")
    for start, length, n in sorted(runs, key=lambda r: -r[1])[:top]:
        lines.append(f"    {start:9.1f} {length:7.1f} {n:4d}")
    lines.append("  longest idle gaps (start us, us):")
    for start, length in sorted(gaps, key=lambda g: -g[1])[:min(top, 5)]:
        lines.append(f"    {start:9.1f} {length:7.2f}")
    lines += chain_lines(ks, top)
    if window is not None:
        lines.append(f"  kernels starting in [{window[0]:.0f}, {window[1]:.0f}) us (start, us, stream, grid, name):")
        for k in ks:
            if window[0] <= k.start < window[1]:
                lines.append(f"    {k.start:9.1f} {k.dur:7.2f} {k.stream:5d} {str(list(k.grid)):14s} {k.name[:60]}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--glue-run", type=int, default=3, help="shortest run of consecutive torch kernels to report")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--list", default="", help="FROM_US:TO_US: list every kernel starting in this window")
    args = ap.parse_args()
    window = None
    if args.list:
        try:
            lo, hi = (float(v) for v in args.list.split(":"))
        except ValueError:
            ap.error(f"--list must be FROM_US:TO_US, got {args.list!r}")
        window = (lo, hi)
    print(report(load_trace(args.trace), args.glue_run, args.top, window))


if __name__ == "__main__":
    main()
