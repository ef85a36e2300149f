"""``stream.side`` on a second CUDA stream: the branch forks from the current stream and joins back into it.

Why (docs/performance.md, thirty-third pass). At batch 1 the routed experts' launches fill about half the SMs
(216 programs of 8 warps, 0.55 waves on 132 SMs) and run at ~45% of the copy bandwidth, while the shared expert's
three launches (two FP8 GEMVs and the SwiGLU, ~35 MB at V4.1's widths) wait behind them although they only read
the layer's normed input. Forked onto a side stream they run beside the routed path; inside a CUDA graph the fork
and the join become two parallel paths of the captured DAG, so graph replay overlaps them with no host work.

Contract (``deepinfer_core.kernels.ops.stream``): the branch reads only its arguments and weights, and the caller
joins it before it reads the result or anything the branch writes (a cache row), and before it lets the arguments
go. So

- the side stream first waits for everything issued so far on the current stream (its inputs are written);
- ``join()`` makes the current stream wait for the side stream, so what follows sees the result, and the
  arguments, read by the branch, are not freed for reuse before the branch is done (the caching allocator frees a
  block for its own stream's later work, which is ordered after the join);
- the result's blocks belong to the side stream's pool: reused only by a later branch, which forks after the
  current stream has consumed this result.

Several branches may be open at once (a sublayer's mHC mix stays open for the whole sublayer while the kv and
shared-expert branches fork and join inside it; an Engram layer's lookup is open from the step's start). Each branch
takes a side stream whose previous branch has been joined, so open branches never queue behind one another; up to
``SIDE_STREAMS`` streams a device, past which a branch takes the stream whose last branch forked earliest.

Scratch the kernels share across launches: the split-K counters (``triton_fp8_gemv._counters``) are per lane, and
a branch on side stream ``i`` runs in lane ``i + 1``, so two GEMVs in flight on two streams never share a counter.
The assignment depends only on the order of forks and joins, so an eager warm-up and a capture of the same step use
the same streams (and the counters exist before the capture).

Off under ``DEEPINFER_NV_COMPILE=1`` (dynamo would have to trace the stream switch; the compiled step keeps one
stream) and with ``DEEPINFER_NV_SIDE_STREAM=0``.
"""
from __future__ import annotations

import contextlib
import os
import threading
import weakref
from typing import Any, Callable

import torch

from deepinfer_core.kernels.ops.stream import Joined, side as side_reference

# On by default since the thirty-third pass: on an H100 (the call asked for an H200 and got an H100) the graphed
# V4.1 step went 2.87 / 2.89 -> 2.61 / 2.78 ms at batch 1 (2.55 / 2.55 -> 2.49 / 2.47 pipelined) and 13.70 / 14.14
# -> 13.41 / 13.81 at batch 32, graphs bit-identical to eager at batch 1 (docs/performance.md).
# ``DEEPINFER_NV_SIDE_STREAM=0``: one stream, the branch in order.
SIDE_STREAM = os.environ.get("DEEPINFER_NV_SIDE_STREAM", "1") == "1"
# Branches whose first tensor has more rows than this run in order: the overlap is for decode-sized launches that
# leave SMs idle (timed at 1 and 32 rows); a prefill's GEMMs fill the GPU each on their own.
SIDE_MAX_ROWS = int(os.environ.get("DEEPINFER_NV_SIDE_STREAM_ROWS", "64"))
# Side streams a device (``DEEPINFER_NV_SIDE_STREAMS``; 1: every branch queues on one stream, as before the
# thirty-sixth pass).
SIDE_STREAMS = max(1, int(os.environ.get("DEEPINFER_NV_SIDE_STREAMS", "4")))
# The chain before the branches (``DEEPINFER_NV_CHAIN_PRIORITY``; on by default since the forty-second pass): graphs
# are captured on a stream of the device's highest priority (``deepinfer_nvidia.graphs``), while the side streams
# keep the default, lowest, one. PyTorch instantiates graphs with ``cudaGraphInstantiateFlagUseNodePriority``, so on
# replay the block scheduler gives a free SM slot to the chain's pending programs before a branch's. Why
# (``docs/perf/pass42a``, H100, batch 1): the two Engram lookups fork at the step's start and their ``wkv`` GEMVs
# (800 programs each) held every slot for ~100 us while layer 0's one-program RMSNorm and its GEMVs waited behind
# their queue. Measured (pipelined, alternated, bit-identical to eager at batch 1): batch 1 -10 to -30 us on H100s,
# even on the H200; the batch-32 row -70 to -115 us on both. ``DEEPINFER_NV_CHAIN_PRIORITY=0``: PyTorch's own
# capture stream, every stream at the default priority.
CHAIN_PRIORITY = os.environ.get("DEEPINFER_NV_CHAIN_PRIORITY", "1")
if CHAIN_PRIORITY not in ("0", "1"):
    raise ValueError(f"DEEPINFER_NV_CHAIN_PRIORITY must be 0 or 1, got {CHAIN_PRIORITY!r}")
HIGHEST = -100  # a priority below the device's range maps to its highest


def chain_priority() -> int | None:
    """The priority graphs are captured with (None: PyTorch's default capture stream)."""
    return HIGHEST if CHAIN_PRIORITY == "1" else None


# device index -> [[stream, a weak reference to its last branch (Forked) or None, fork number]]; weak, so that a
# joined branch's result is not kept alive by the pool (a branch dropped unjoined frees its stream too: what it
# queued there runs before anything queued after it)
_POOLS: dict[int, list[list]] = {}
_FORKS = [0]  # forks so far (orders the streams' last use)
_STATE = threading.local()  # .lane: 0 for the current stream's launches, i + 1 inside a branch on side stream i


def lane() -> int:
    """Which scratch set a launch issued now must use: ``i + 1`` inside a branch on side stream ``i``, else 0."""
    return getattr(_STATE, "lane", 0)


@contextlib.contextmanager
def _in_branch(lane_id: int):
    before, _STATE.lane = lane(), lane_id
    try:
        yield
    finally:
        _STATE.lane = before


def _side_stream(device: torch.device) -> tuple[list, int]:
    """A free side stream of ``device`` (its last branch joined, or a new one up to ``SIDE_STREAMS``; else the one
    whose last branch forked earliest): its pool entry and its lane."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    pool = _POOLS.setdefault(idx, [])
    for i, entry in enumerate(pool):
        last = entry[1]() if entry[1] is not None else None
        if last is None or last.joined:
            return entry, i + 1
    if len(pool) < SIDE_STREAMS:
        pool.append([torch.cuda.Stream(device=idx), None, 0])
        return pool[-1], len(pool)
    i = min(range(len(pool)), key=lambda j: pool[j][2])
    return pool[i], i + 1


class Forked:
    """A branch running on ``side``: ``join()`` orders the stream that forked it after it and returns its result."""

    __slots__ = ("value", "main", "side", "joined", "__weakref__")

    def __init__(self, value: Any, main: torch.cuda.Stream, side: torch.cuda.Stream) -> None:
        self.value, self.main, self.side, self.joined = value, main, side, False

    def join(self) -> Any:
        if not self.joined:
            self.main.wait_stream(self.side)
            self.joined = True
        return self.value


def _device_of(args: tuple) -> torch.device | None:
    """The CUDA device of the first tensor argument, or None (not on CUDA, or more than ``SIDE_MAX_ROWS`` rows)."""
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device if a.is_cuda and (a.dim() == 0 or a.shape[0] <= SIDE_MAX_ROWS) else None
    return None


def _compiling() -> bool:
    from deepinfer_nvidia.graphs import compile_enabled

    return compile_enabled() or torch.compiler.is_compiling()


def side(fn: Callable[..., Any], *args: Any, enabled: bool | None = None) -> Joined | Forked:
    """``fn(*args)`` on the device's side stream (``enabled``: default ``SIDE_STREAM``). Runs in order, as the
    reference does, where the knob is off, the first tensor argument is not on a CUDA device or has more than
    ``SIDE_MAX_ROWS`` rows, the call comes from inside a branch (a nested branch runs inline on its stream) or the
    step is compiled."""
    device = _device_of(args)
    if not (SIDE_STREAM if enabled is None else enabled) or device is None or lane() or _compiling():
        return side_reference(fn, *args)
    main = torch.cuda.current_stream(device)
    entry, lane_id = _side_stream(device)
    stream = entry[0]
    stream.wait_stream(main)  # the branch's inputs are written on the current stream
    with torch.cuda.stream(stream), _in_branch(lane_id):
        value = fn(*args)
    _FORKS[0] += 1
    branch = Forked(value, main, stream)
    entry[1], entry[2] = weakref.ref(branch), _FORKS[0]
    return branch


def supports(fn: Callable[..., Any], *args: Any) -> bool:
    """Every call is taken (``side`` itself runs inline where a second stream cannot help)."""
    return True
