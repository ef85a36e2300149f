"""``benchmarks/trace_timeline.py``: on made-up traces, the busy union and idle gaps across streams, the kernel
families, the runs of consecutive torch kernels and the estimated critical chain; on the forty-second pass's H200
graph-replay trace (kept in ``docs/perf/pass42d``), the figures the pass record quotes."""
from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.trace_timeline import (critical_chain, family, glue_runs, idle_gaps, is_glue, kernels, load_trace,
                                       report)

REPO = Path(__file__).resolve().parents[2]


def _k(stream, ts, dur, name, grid=(1, 1, 1)):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"stream": stream, "grid": grid}}


GLUE = "void at::native::vectorized_elementwise_kernel<4, add>(int)"


def test_made_up_trace():
    trace = {"traceEvents": [
        _k(7, 100.0, 10.0, "_gemv_kernel"), _k(9, 105.0, 10.0, "_gate_kernel"),  # overlap across streams
        _k(7, 120.0, 1.0, GLUE), _k(7, 121.5, 1.0, GLUE), _k(7, 123.0, 1.0, GLUE),  # a glue run of 3
        _k(7, 124.5, 2.0, "_rms_kernel"), _k(7, 127.0, 1.0, GLUE),  # a lone glue kernel: no run
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 0.0, "dur": 999.0},  # not a kernel
    ]}
    ks = kernels(trace)
    assert [k.start for k in ks][:2] == [0.0, 5.0] and len(ks) == 7 and ks[1].stream == 9
    busy, gaps = idle_gaps(ks)
    assert busy == pytest.approx(15.0 + 3 * 1.0 + 2.0 + 1.0)
    assert [(round(s, 1), round(g, 1)) for s, g in gaps] == [(15.0, 5.0), (21.0, 0.5), (22.5, 0.5), (24.0, 0.5),
                                                             (26.5, 0.5)]
    assert glue_runs(ks, 3) == [(20.0, 4.0, 3)] and glue_runs(ks, 4) == []
    assert family(GLUE) == "at::native::vectorized_elementwise_kernel" and is_glue(GLUE)
    assert not is_glue("_rms_kernel")
    text = report(trace, glue_run=3, window=(20.0, 25.0))
    assert "7 kernels on 2 streams over 28.0 us" in text and "torch glue: 4 launches, 4.0 us" in text
    assert "4.0 us in 1 runs" in text and text.count("at::native") >= 3
    with pytest.raises(ValueError, match="no kernel events"):
        kernels({"traceEvents": []})


def test_critical_chain_follows_its_stream_and_the_joins():
    """The chain walks back from the last kernel: through its own stream while that stream's kernel ended about as
    late as any, across to another stream when the branch there ended clearly later (the join it waited on), and
    never through a kernel that overlaps it."""
    own = {"traceEvents": [_k(1, 0.0, 10.0, "a"), _k(2, 0.0, 10.6, "side"), _k(1, 10.8, 9.2, "b")]}
    assert [k.name for k in critical_chain(kernels(own))] == ["a", "b"]  # side ended only 0.6 us after a
    join = {"traceEvents": [
        _k(1, 0.0, 10.0, "a"), _k(3, 0.5, 24.5, "side_long"),  # c waits on side_long's join (15 us after a)
        _k(1, 25.3, 3.0, "c"), _k(4, 26.0, 1.0, "overlapping"),  # starts inside c: not c's input
        _k(1, 28.5, 2.0, "d"),
    ]}
    assert [k.name for k in critical_chain(kernels(join))] == ["side_long", "c", "d"]
    text = report(join)
    assert "critical chain (estimated from the timestamps, critical_chain): 3 kernels, 29.5 us running" in text


def test_the_h200_graph_replay_trace():
    path = REPO / "docs/perf/pass42d/lead2_trace_triton_graphs_decode_B_1.json.gz"
    ks = kernels(load_trace(path))
    assert len(ks) == 335 and len({k.stream for k in ks}) == 26
    runs = sorted(glue_runs(ks, 3), key=lambda r: -r[1])
    # the candidate consumer's mask (12 launches, ~25 us) and the ratio-2 kv source's glue (10 launches)
    assert [(round(s), n) for s, _, n in runs[:2]] == [(1355, 12), (451, 10)]
    assert "335 kernels on 26 streams" in report(load_trace(path))
