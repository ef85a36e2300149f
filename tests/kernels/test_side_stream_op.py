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
    monkeypatch.setattr(css.torch.cuda, "Stream", lambda device, priority=0: object())
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
    assert lane_e == 1 and len(css._POOLS[(0, False)]) == 2


@pytest.mark.parametrize("mode", ["0", "all", "slack"])
def test_slack_branches_get_their_own_low_priority_streams_and_lanes(monkeypatch, mode):
    """Under ``CHAIN_PRIORITY`` "slack" a slack branch takes a stream of the lowest priority from its own pool, in lanes
    after the ordinary streams' (so its split-K counters are its own); in the other modes slack changes nothing."""
    from deepinfer_nvidia.kernels import cuda_side_stream as css

    made = []

    def stream(device, priority=0):
        made.append(priority)
        return object()

    monkeypatch.setattr(css, "_POOLS", {})
    monkeypatch.setattr(css, "SIDE_STREAMS", 2)
    monkeypatch.setattr(css, "CHAIN_PRIORITY", mode)
    monkeypatch.setattr(css.torch.cuda, "Stream", stream)
    dev = torch.device("cuda", 0)
    ordinary, lane_o = css._side_stream(dev)
    ordinary[1] = lambda: None  # held open
    slack, lane_s = css._side_stream(dev, slack=True)
    if mode == "slack":
        assert (lane_o, lane_s) == (1, 3) and slack is not ordinary and made == [-100, 0]
        assert set(css._POOLS) == {(0, False), (0, True)}
    else:
        assert (lane_o, lane_s) == (1, 1) and slack is ordinary and made == [0]


def test_slack_is_accepted_and_changes_nothing_in_order(monkeypatch):
    """``slack=True`` (an Engram lookup, joined layers later) is a scheduling hint: the reference and the NVIDIA
    provider's in-order path run the branch at once with the same result."""
    from deepinfer_nvidia.kernels import cuda_side_stream as css

    x = torch.randn(2, 3)
    assert torch.equal(side(torch.tanh, x, slack=True).join(), torch.tanh(x))
    monkeypatch.setattr(css, "SIDE_STREAM", True)
    got = css.side(torch.tanh, x, slack=True)
    assert isinstance(got, Joined) and torch.equal(got.join(), torch.tanh(x))
    assert css.supports(torch.tanh, x, slack=True)


@pytest.mark.parametrize("mode, chain, ordinary, slack", [
    ("0", None, 0, 0),            # every stream at the default priority, PyTorch's own capture stream
    ("all", -100, 0, 0),          # the captured chain first, every branch after it
    ("slack", -100, -100, 0),     # only slack branches after the chain and the ordinary branches
])
def test_chain_priority_modes(monkeypatch, mode, chain, ordinary, slack):
    """``DEEPINFER_NV_CHAIN_PRIORITY``: the capture stream's priority and each kind of branch stream's (-100 maps to
    the device's highest; 0 is the default and lowest)."""
    from deepinfer_nvidia.kernels import cuda_side_stream as css

    monkeypatch.setattr(css, "CHAIN_PRIORITY", mode)
    assert css.chain_priority() == chain
    assert css._branch_priority(False) == ordinary and css._branch_priority(True) == slack


def test_chain_priority_knob_refuses_other_values():
    import subprocess
    import sys

    code = "import deepinfer_nvidia.kernels.cuda_side_stream"
    env = {"DEEPINFER_NV_CHAIN_PRIORITY": "high", "PATH": ""}
    import os

    res = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True)
    assert res.returncode != 0 and "DEEPINFER_NV_CHAIN_PRIORITY must be 0, all or slack, got 'high'" in res.stderr


def test_slack_tiles_only_inside_a_slack_branch(monkeypatch):
    """``SLACK_GEMV_TILES`` paces the FP8 GEMVs a slack branch issues (``gemv_wgmma_paced``): ``slack_tiles()`` is
    the knob inside a slack branch, 0 inside an ordinary one and outside, and the state unwinds."""
    from deepinfer_nvidia.kernels import cuda_side_stream as css

    monkeypatch.setattr(css, "SLACK_GEMV_TILES", 66)
    assert css.slack_tiles() == 0
    with css._in_branch(5, slack=True):
        assert css.slack_tiles() == 66 and css.lane() == 5
        with css._in_branch(1):
            assert css.slack_tiles() == 0
        assert css.slack_tiles() == 66
    assert css.slack_tiles() == 0 and css.lane() == 0
