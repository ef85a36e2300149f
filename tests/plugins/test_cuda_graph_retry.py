"""``CudaGraphRunner`` repeats a failed capture once (synchronising first), and gives up on a second failure
(thirteenth pass: captures of the full-width step failed now and then on the H200). The capture itself needs a
GPU; here ``_capture_once`` is replaced so the retry logic runs on the CPU."""
import pytest
import torch

from deepinfer_nvidia import graphs as nvg


def _runner(monkeypatch, outcomes):
    calls = []

    def fake_once(self, args, kwargs):
        calls.append(args)
        result = outcomes.pop(0)
        if isinstance(result, Exception):
            raise result
        return result

    monkeypatch.setattr(nvg.CudaGraphRunner, "_capture_once", fake_once)
    syncs = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: syncs.append(1))
    return nvg.CudaGraphRunner(lambda *a: None), calls, syncs


def test_a_failed_capture_is_repeated_once(monkeypatch):
    runner, calls, syncs = _runner(monkeypatch, [RuntimeError("operation failed due to a previous error during "
                                                              "capture"), "captured"])
    assert runner._capture((1, 2), {}) == "captured"
    assert len(calls) == 2 and syncs == [1] and runner.failed_captures == 1
    assert len(runner.capture_seconds) == 1 and runner.capture_seconds[0] >= 0.0  # the capture that succeeded


def test_a_second_failure_propagates(monkeypatch):
    runner, calls, _ = _runner(monkeypatch, [RuntimeError("first"), ValueError("second")])
    with pytest.raises(ValueError, match="second"):
        runner._capture((1,), {})
    assert len(calls) == 2 and runner.failed_captures == 1 and runner.capture_seconds == []


def test_host_tensors_are_refused_before_any_attempt(monkeypatch):
    runner, calls, _ = _runner(monkeypatch, ["never"])
    with pytest.raises(ValueError, match="needs device tensors"):
        runner._capture((torch.zeros(2),), {})
    assert calls == []
