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


def test_stream_pool_takes_free_streams_first(monkeypatch):
    """``_side_stream``'s choice, with stand-in streams: a branch takes the first stream whose last branch is joined
    (or gone), a new one while fewer than ``SIDE_STREAMS`` exist, else the stream whose last branch forked
    earliest; the lane is the stream's place + 1. The pool holds branches weakly."""
    import gc
    import weakref

    from deepinfer_nvidia.kernels import cuda_side_stream as css

    monkeypatch.setattr(css, "_POOLS", {})
    monkeypatch.setattr(css, "SIDE_STREAMS", 2)
    monkeypatch.setattr(css.torch.cuda, "Stream", lambda device: object())
    dev = torch.device("cuda", 0)
    forks = [0]

    def fork():
        entry, lane = css._side_stream(dev)
        forks[0] += 1
        branch = css.Forked(forks[0], None, entry[0])
        entry[1], entry[2] = weakref.ref(branch), forks[0]
        return branch, lane, entry[0]

    a, lane_a, sa = fork()
    b, lane_b, sb = fork()  # a open: a second stream
    assert (lane_a, lane_b) == (1, 2) and sa is not sb
    c, lane_c, sc = fork()  # both open and the pool full: the stream whose branch forked first
    assert lane_c == 1 and sc is sa
    b.joined = True
    d, lane_d, _ = fork()  # b joined: its stream is free
    assert lane_d == 2
    del c
    gc.collect()
    e, lane_e, _ = fork()  # c (stream 1's last branch) dropped: its stream is free again
    assert lane_e == 1 and len(css._POOLS[0]) == 2


@pytest.mark.parametrize("mode, chain", [("1", -100), ("0", None)])
def test_chain_priority_modes(monkeypatch, mode, chain):
    """``DEEPINFER_NV_CHAIN_PRIORITY``: graphs are captured on a stream of the highest priority (-100 maps to the
    device's highest) or on PyTorch's own capture stream; side streams keep the default (lowest) priority."""
    from deepinfer_nvidia.kernels import cuda_side_stream as css

    monkeypatch.setattr(css, "CHAIN_PRIORITY", mode)
    assert css.chain_priority() == chain


def test_chain_priority_knob_refuses_other_values():
    """A bad value stops the import with an error naming the variable and the value."""
    import os
    import subprocess
    import sys

    code = "import deepinfer_nvidia.kernels.cuda_side_stream"
    env = {**os.environ, "DEEPINFER_NV_CHAIN_PRIORITY": "high"}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert res.returncode != 0 and "DEEPINFER_NV_CHAIN_PRIORITY must be 0 or 1, got 'high'" in res.stderr

