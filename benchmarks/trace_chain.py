"""Where a profiled decode step's main stream waits: a chrome trace's kernels per CUDA stream, the main stream's
gaps, and which side-stream kernel ended as each gap closed (a ``stream.side`` join the chain waited on).

    python benchmarks/trace_chain.py TRACE.json[.gz] [--min-gap-us 1.0] [--top 15]

``sweep_timing.profile_step`` writes such a trace next to ``profile.txt`` when ``DEEPINFER_SWEEP_TRACE=1``
(``trace_<title>.json``) and appends this report to ``profile.txt``. The main stream is the one with the most
kernels. A gap is the time between one main-stream kernel's end and the next one's start (programmatic dependent
launch makes most of them negative: overlaps, not counted). A gap is put down to a side stream when one of its
kernels ended inside the gap or within ``slack_us`` after it closed; else it is the chain's own latency (launch,
dependency, a non-PDL kernel) and is reported as "chain". On a graph replay the trace holds every kernel of the
graph with its stream, so this is the replayed step's timeline.
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from benchmarks.trace_timeline import kernels, load_trace  # noqa: E402


def kernels_by_stream(trace: dict) -> dict[int, list[tuple[float, float, str]]]:
    """``{stream: [(start_us, end_us, name), ...]}`` sorted by start, from a chrome trace's kernel events (read by
    ``trace_timeline.kernels``; times from the first kernel's start)."""
    try:
        ks = kernels(trace)
    except ValueError:  # no kernel events: the caller reports it
        return {}
    out: dict[int, list] = defaultdict(list)
    for k in ks:
        out[k.stream].append((k.start, k.end, k.name))
    return dict(out)


def chain_report(trace: dict, min_gap_us: float = 1.0, slack_us: float = 2.0) -> dict:
    """The main stream's span, kernel time and gaps (>= ``min_gap_us``), each gap put down to the side-stream kernel
    that ended latest before (or ``slack_us`` after) it closed, or to the chain. Returns a dict with ``span_us``,
    ``main_stream``, ``main_kernels``, ``gap_us``, ``by_cause`` ({cause: [us, count]}) and ``gaps`` (largest first:
    (us, kernel before, kernel after, cause))."""
    streams = kernels_by_stream(trace)
    if not streams:
        raise ValueError("trace_chain: no kernel events in the trace (was CUDA activity recorded?)")
    main = max(streams, key=lambda s: len(streams[s]))
    ks = streams[main]
    side_ends = sorted((end, name, s) for s, v in streams.items() if s != main for _, end, name in v)
    by_cause: dict[str, list] = defaultdict(lambda: [0.0, 0])
    gaps = []
    for (_, end0, name0), (start1, _, name1) in zip(ks, ks[1:]):
        gap = start1 - end0
        if gap < min_gap_us:
            continue
        waited = [(e, n, s) for e, n, s in side_ends if end0 <= e <= start1 + slack_us]
        cause = f"stream {waited[-1][2]}: {waited[-1][1]}" if waited else "chain"
        by_cause[cause][0] += gap
        by_cause[cause][1] += 1
        gaps.append((gap, name0, name1, cause))
    return {"span_us": ks[-1][1] - ks[0][0], "main_stream": main, "main_kernels": len(ks),
            "streams": {s: len(v) for s, v in streams.items()}, "gap_us": sum(g[0] for g in gaps),
            "by_cause": dict(by_cause), "gaps": sorted(gaps, reverse=True)}


def format_report(rep: dict, top: int = 15) -> str:
    lines = [f"main stream {rep['main_stream']}: {rep['main_kernels']} kernels over {rep['span_us']:.1f} us, "
             f"gaps {rep['gap_us']:.1f} us; kernels per stream {rep['streams']}"]
    for cause, (us, n) in sorted(rep["by_cause"].items(), key=lambda kv: -kv[1][0]):
        lines.append(f"  {us:8.1f} us in {n:3d} gaps  {cause[:110]}")
    lines.append(f"  largest gaps (us, before -> after, cause):")
    for gap, a, b, cause in rep["gaps"][:top]:
        lines.append(f"  {gap:8.1f}  {a[:40]} -> {b[:40]}  [{cause[:60]}]")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--min-gap-us", type=float, default=1.0)
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    rep = chain_report(load_trace(args.trace), args.min_gap_us)
    print(format_report(rep, args.top))


if __name__ == "__main__":
    main()
