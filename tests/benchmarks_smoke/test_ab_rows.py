"""``benchmarks/ab_rows.py``: the alternated A/B rows of the device scripts summarised per label and row."""
from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.ab_rows import readings, report, summarise

_LOG = """== KNOB=0
[ 28.2s] +graphs   decode B=1                  1.98 ms (meta 0.36) x2.1  alternated eager/graphs 19.23 / 2.06 ms; pipelined 1.93 ms (x2.08)
[ 41.6s] +graphs   decode B=64                15.40 ms (meta 0.81) x1.6  pipelined 15.05 ms (x1.59)
== KNOB=1
[  4.8s] +graphs   decode B=1                  2.00 ms (meta 0.56) x2.2  pipelined 1.90 ms (x2.05)
[  6.7s] +graphs   decode B=64                15.47 ms (meta 0.87) x1.6  pipelined 15.04 ms (x1.59)
ValueError: a line that is not a row
== KNOB=0
[  4.8s] +graphs   decode B=1                  2.01 ms (meta 0.42) x2.2  pipelined 1.94 ms (x2.09)
[  8.1s] +graphs   decode B=32 ctx=128        10.57 ms (meta 0.45) x1.7  pipelined 10.43 ms (x1.71)
== KNOB=1
[  4.8s] +graphs   decode B=1                  2.00 ms (meta 0.56) x2.2  pipelined 1.91 ms (x2.05)
[  6.7s] +graphs   decode B=64                15.47 ms (meta 0.87) x1.6  pipelined 15.10 ms (x1.59)
[  8.1s] +graphs   decode B=32 ctx=128        10.57 ms (meta 0.45) x1.7  alternated eager/graphs 23.03 / 10.66 ms
"""


def test_readings_collect_each_label_and_row():
    data = readings(_LOG)
    assert list(data) == ["KNOB=0", "KNOB=1"]
    assert data["KNOB=0"] == {"B=1": [1.93, 1.94], "B=64": [15.05], "B=32 ctx=128": [10.43]}
    assert data["KNOB=1"] == {"B=1": [1.90, 1.91], "B=64": [15.04, 15.10]}  # a row without pipelined: skipped


def test_summary_against_each_rows_first_label():
    by = {(e["label"], e["row"]): e for e in summarise(readings(_LOG))}
    b1 = by[("KNOB=1", "B=1")]
    assert b1["mean"] == pytest.approx(1.905) and b1["delta_ms"] == pytest.approx(-0.03)
    assert b1["separated"] == "faster"
    assert by[("KNOB=1", "B=64")]["separated"] == "overlap"  # 15.04 beats 15.05, 15.10 does not
    assert "delta_ms" not in by[("KNOB=0", "B=1")]  # the baseline itself
    assert summarise({}) == []


def test_report_on_a_real_device_log():
    log = Path(__file__).resolve().parents[2] / "docs" / "perf" / "pass36h" / "ab_rows.txt"
    text = report(log)
    assert "pass 36 defaults" in text and "-120 us (-5.8%), faster" in text
