"""``benchmarks/plot_sweeps.py``: the graphed rows of a ``v41_row`` log are parsed (roofline recovered from the
pipelined ratio), sections are kept apart, and merging keeps each label's fastest pipelined reading."""
from __future__ import annotations

import pytest

from benchmarks.plot_sweeps import merge, rows_from_log

LOG = """== pass 35 defaults
[    4.8s] +graphs   decode B=1                  2.13 ms (meta 0.40) x2.3  bit-identical to eager: True (max diff 0.00e+00); alternated eager/graphs 20.48 / 2.27 ms; pipelined 2.06 ms (x2.22)
== pass 36 defaults
[    4.7s] +graphs   decode B=1                  2.18 ms (meta 0.75) x2.4  bit-identical to eager: True (max diff 0.00e+00); alternated eager/graphs 36.18 / 2.26 ms; pipelined 1.95 ms (x2.10)
[    8.1s] +graphs   decode B=32 ctx=128        10.60 ms (meta 0.45) x1.7  bit-identical to eager: False (max diff 7.92e-01); alternated eager/graphs 21.59 / 10.73 ms; pipelined 10.44 ms (x1.71)
== pass 36 defaults
[    4.3s] +graphs   decode B=1                  2.00 ms (meta 0.34) x2.2  bit-identical to eager: True (max diff 0.00e+00); alternated eager/graphs 19.00 / 2.09 ms; pipelined 1.93 ms (x2.07)
"""


def test_rows_by_section_and_fastest_reading():
    every = rows_from_log(LOG, None)
    assert [r["label"] for r in every] == ["decode B=1", "decode B=1", "decode B=32 ctx=128", "decode B=1"]
    mine = rows_from_log(LOG, "pass 36 defaults")
    assert [r["pipelined_ms"] for r in mine] == [1.95, 10.44, 1.93]
    assert mine[0]["roofline_ms"] == pytest.approx(1.95 / 2.10)
    merged = merge([{"config": {"arch": "v41", "layers": 8}, "device": "H200",
                     "rows": [{"provider": "triton", "label": "prefill L=8192", "ms": 197.0, "roofline_ms": 14.35}]}],
                   mine)
    by = {(r["provider"], r["label"]): r for r in merged["rows"]}
    assert by[("triton+graphs", "decode B=1")]["ms"] == 2.00  # the reading with the faster pipelined time
    assert by[("triton+graphs pipelined", "decode B=1")]["ms"] == 1.93
    assert by[("triton", "prefill L=8192")]["ms"] == 197.0 and merged["device"] == "H200"
    assert len(merged["rows"]) == 5
