"""``stream.side`` without a GPU: the reference runs the branch at once and ``join()`` returns its result; the
NVIDIA provider takes every call and runs in order where no CUDA tensor is given (or its knob is off), outside
any lane; a model's layer gives the same logits whichever runs it. The two-stream path is checked on the device
(``deepinfer_nvidia/tests/test_side_stream.py``)."""
from __future__ import annotations

import pytest
import torch

from deepinfer_core.kernels.ops.stream import Joined, side


def test_reference_runs_the_branch_now():
    calls = []

    def branch(a, b):
        calls.append(1)
        return a @ b

    x, w = torch.randn(3, 4), torch.randn(4, 5)
    got = side(branch, x, w)
    assert calls == [1] and isinstance(got, Joined)
    assert torch.equal(got.join(), x @ w) and got.join() is got.join()


def test_reference_refuses_a_non_callable():
    with pytest.raises(TypeError, match="stream.side: the branch must be callable, got Tensor"):
        side(torch.ones(2), torch.ones(2))


def test_harness_cases_pass_for_the_reference():
    from deepinfer_core.testing.conformance import check_impl

    assert check_impl("stream.side", "reference", "cpu") == 12


def test_nvidia_provider_runs_cpu_operands_in_order(monkeypatch):
    from deepinfer_nvidia.kernels import cuda_side_stream as css

    monkeypatch.setattr(css, "SIDE_STREAM", True)
    x = torch.randn(2, 3)
    got = css.side(torch.tanh, x)
    assert isinstance(got, Joined) and torch.equal(got.join(), torch.tanh(x)) and css.lane() == 0
    assert css.supports(torch.tanh, x)


def test_nvidia_registers_the_op_batch_invariant():
    from deepinfer_nvidia.kernels import IMPLS

    rows = [row for row in IMPLS if row[0] == "stream.side"]
    assert rows == [("stream.side", "aten", "deepinfer_nvidia.kernels.cuda_side_stream:side",
                     "deepinfer_nvidia.kernels.cuda_side_stream:supports", True)]


def test_lanes_nest_and_belong_to_their_thread():
    """The split-K counters are chosen by ``lane()``: the branch's stream's lane (side stream i: i + 1) while it issues
    its launches, the previous lane after, and a thread that is not inside a branch stays in lane 0."""
    import threading

    from deepinfer_nvidia.kernels import cuda_side_stream as css

    seen = []
    assert css.lane() == 0
    with css._in_branch(2):
        seen.append(css.lane())
        other = threading.Thread(target=lambda: seen.append(css.lane()))
        other.start()
        other.join()
        with css._in_branch(3):
            seen.append(css.lane())
        seen.append(css.lane())
    assert seen == [2, 0, 3, 2] and css.lane() == 0
