"""``benchmarks/trace_chain.py`` on a made-up chrome trace: the main stream is the busiest, overlapping kernels
(programmatic dependent launch) are not gaps, and a gap is put down to the side-stream kernel that ended as it
closed, or to the chain."""
from __future__ import annotations

import pytest

from benchmarks.trace_chain import chain_report, format_report


def _k(stream, ts, dur, name):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"stream": stream}}


def test_gaps_and_their_causes():
    trace = {"traceEvents": [
        _k(7, 0.0, 10.0, "expand"), _k(7, 9.0, 5.0, "collapse_norm"),  # overlap: no gap
        _k(7, 20.0, 10.0, "gemv_a"),  # 6 us gap, nothing ended on the side: the chain's own
        _k(7, 40.0, 5.0, "gemv_b"),  # 10 us gap closed by the side stream's gate ending at 39
        _k(7, 45.5, 2.0, "tiny"),  # 0.5 us: under the threshold
        _k(13, 14.0, 25.0, "gate"), _k(13, 2.0, 3.0, "proj"),
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 0.0, "dur": 99.0},  # not a kernel
    ]}
    rep = chain_report(trace, min_gap_us=1.0)
    assert rep["main_stream"] == 7 and rep["main_kernels"] == 5 and rep["streams"] == {7: 5, 13: 2}
    assert rep["gap_us"] == pytest.approx(16.0) and rep["span_us"] == pytest.approx(47.5)
    assert rep["by_cause"] == {"chain": [6.0, 1], "stream 13: gate": [10.0, 1]}
    assert [g[:3] for g in rep["gaps"]] == [(10.0, "gemv_a", "gemv_b"), (6.0, "collapse_norm", "gemv_a")]
    text = format_report(rep)
    assert "stream 13: gate" in text and "gaps 16.0 us" in text


def test_no_kernels_is_an_error():
    with pytest.raises(ValueError, match="no kernel events"):
        chain_report({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "x", "ts": 0, "dur": 1}]})


def test_profile_step_writes_the_trace_and_the_report(tmp_path, monkeypatch):
    """``sweep_timing.profile_step`` with ``DEEPINFER_SWEEP_TRACE=1`` on the CPU: the chrome trace is written beside
    ``profile.txt`` and the report's place says why there is none (no CUDA kernels here)."""
    import torch

    from benchmarks import sweep_timing

    monkeypatch.setenv("DEEPINFER_SWEEP_TRACE", "1")

    class _Ex:
        def run(self, ids, slices):
            return torch.ones(2, 4) @ torch.ones(4, 4)

    class _Model:
        def compute_logits(self, h):
            return h.sum(-1)

    with open(tmp_path / "profile.txt", "w") as fh:
        sweep_timing.profile_step(_Model(), _Ex(), None, None, True, "triton decode B=1", fh)
    assert (tmp_path / "trace_triton_decode_B_1.json").exists()
    assert "no kernel events" in (tmp_path / "profile.txt").read_text()
