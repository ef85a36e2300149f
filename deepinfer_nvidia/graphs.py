"""CUDA graph capture and replay for the model runner's step function.

``CudaGraphRunner(fn)`` is what ``NvidiaPlatform.graph_runner(fn)`` returns. The
first call with a new *signature* (shapes, dtypes and devices of the tensor
arguments, values of the others) warms ``fn`` up on a side stream, captures it
into a ``torch.cuda.CUDAGraph`` and keeps the captured inputs and outputs as
static buffers. Every later call with that signature copies its tensors into
the static inputs and replays: no Python runs inside ``fn``.

Why this shape:
- one memory pool is shared by every captured graph, because graphs of one
  runner never run concurrently (one stream, one step at a time); this keeps
  the memory cost of N batch-size buckets close to that of the largest one;
- the returned outputs ARE the static output buffers: they are overwritten by
  the next replay of the same signature. The model runner consumes logits
  (samples) before it launches the next step, so no copy is made here.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable

import torch

logger = logging.getLogger(__name__)

# ``DEEPINFER_NV_COMPILE=1``: the step function is compiled by ``torch.compile`` (inductor) before it is captured,
# so the model's torch glue between kernel calls (index math, casts, the shared expert's SwiGLU: 326 small ops a
# batch-1 V4.1 step on 10 layers, ``benchmarks/step_glue_ops.py``) runs as a few fused kernels; the registered
# kernels themselves stay opaque (``NvidiaPlatform.wrap_kernel`` -> ``opaque_kernel``: graph breaks around them).
# Measured in the twenty-eighth pass (H200, ``docs/performance.md``): batch-1 V4.1 step 2.48 -> 2.26 ms. Never in
# batch-invariant mode: fused kernels do not promise batch-independent bits.
#
# Shapes are static (``dynamic=False``): each (batch bucket, context bucket) signature compiles once, 20-35 s on the
# H200 host (pass28c). Dynamic shapes would bound the count (two compiles: batch 1, then every other bucket and
# context), but measured on the H200 (pass29b) they lost: the capture that compiles took 89-124 s, and the steps
# were slower (V4 batch 32 pipelined 2.60 ms against 2.45 static and 2.66 uncompiled; V4.1 batch 1 2.34 against
# 2.26 static).
_COMPILE_RECOMPILES = 256  # graphs per process: one per (batch, context) bucket of each step function
_CAPTURE_STREAMS: dict[int, torch.cuda.Stream] = {}


def _capture_stream() -> torch.cuda.Stream | None:
    """The stream graphs are captured on: None (PyTorch's own capture stream) unless
    ``cuda_side_stream.CHAIN_PRIORITY`` asks for a priority, then one such stream a device."""
    from deepinfer_nvidia.kernels.cuda_side_stream import chain_priority

    priority = chain_priority()
    if priority is None:
        return None
    idx = torch.cuda.current_device()
    if idx not in _CAPTURE_STREAMS:
        _CAPTURE_STREAMS[idx] = torch.cuda.Stream(device=idx, priority=priority)
    return _CAPTURE_STREAMS[idx]


def compile_enabled() -> bool:
    """Whether ``DEEPINFER_NV_COMPILE`` asks for compiled steps (``0``/``1``/unset; anything else is refused)
    and the kernel mode allows them (not batch-invariant)."""
    value = os.environ.get("DEEPINFER_NV_COMPILE", "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"DEEPINFER_NV_COMPILE must be 0 or 1 (or unset), got {value!r}")
    if value != "1":
        return False
    from deepinfer_core.kernels.mode import batch_invariant_enabled

    if batch_invariant_enabled():
        logger.warning("DEEPINFER_NV_COMPILE=1 is ignored in batch-invariant mode")
        return False
    return True


def opaque_kernel(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` hidden from ``torch.compile`` (called as it is, a graph break around it): a registered kernel is
    one or a few launches already, and dynamo could neither trace its Gluon / PDL launches nor inductor its
    reference's float8_e8m0fnu scales (seen on the CPU)."""
    return torch.compiler.disable(fn)


def compiled_step(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` under ``torch.compile(dynamic=False)``: every step shape gets its own specialised graph (above), so
    dynamo's per-function recompile limit (8 by default) is raised to ``_COMPILE_RECOMPILES``: past it, new
    buckets would silently run as eager frames."""
    import torch._dynamo

    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):  # the newer name, and the older one
        if hasattr(cfg, name):
            setattr(cfg, name, max(int(getattr(cfg, name)), _COMPILE_RECOMPILES))
    return torch.compile(fn, dynamic=False)


def _signature(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """Hashable key: (shape, dtype, device) for tensors, the value itself otherwise."""

    def one(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return ("tensor", tuple(value.shape), value.dtype, value.device)
        try:
            hash(value)
        except TypeError:
            raise TypeError(
                f"CudaGraphRunner arguments must be tensors or hashable values (they key the graph), "
                f"got {type(value).__name__}"
            ) from None
        return ("value", value)

    return tuple(one(a) for a in args) + tuple((k, one(v)) for k, v in sorted(kwargs.items()))


class _Captured:
    """One captured graph with its static input and output buffers."""

    def __init__(self, graph: torch.cuda.CUDAGraph, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        self.graph = graph
        self.args = args
        self.kwargs = kwargs
        self.out = out


class CudaGraphRunner:
    """Capture ``fn`` once per input signature, then replay it.

    ``fn(*args, **kwargs)`` must be capturable: device tensors only, no host
    synchronisation, no data-dependent shapes, and outputs that are tensors
    (or nested tuples/lists/dicts of them). ``warmup`` eager calls run before
    each capture so lazy initialisation (cuBLAS handles, Triton autotuning) is
    not recorded into the graph.
    """

    def __init__(self, fn: Callable[..., Any], warmup: int = 2, compile: bool = False) -> None:
        """``compile``: run ``fn`` through ``compiled_step`` (the platform passes ``compiles_steps()``)."""
        if warmup < 1:
            raise ValueError(f"warmup must be >= 1 (lazy init must not be captured), got {warmup}")
        self.fn = compiled_step(fn) if compile else fn
        self.warmup = warmup
        self._graphs: dict[tuple[Any, ...], _Captured] = {}
        self._pool: Any = None
        self.failed_captures = 0  # captures that failed and were repeated (a diagnostic)
        self.capture_seconds: list[float] = []  # wall time of each successful capture, warm-ups (and compiles) included
        self.compiles = compile

    @property
    def num_graphs(self) -> int:
        return len(self._graphs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key = _signature(args, kwargs)
        captured = self._graphs.get(key)
        if captured is None:
            captured = self._capture(args, kwargs)
            self._graphs[key] = captured
        for static, new in zip(captured.args, args, strict=True):
            if isinstance(new, torch.Tensor) and new is not static:
                static.copy_(new)
        for name, new in kwargs.items():
            static = captured.kwargs[name]
            if isinstance(new, torch.Tensor) and new is not static:
                static.copy_(new)
        captured.graph.replay()
        return captured.out

    def _capture(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Captured:
        """Warm up and capture once more when a capture fails: on the H200 a capture of the same step
        failed now and then ("operation failed due to a previous error during capture", thirteenth pass)
        and succeeded when repeated; a second failure propagates (the caller then runs eagerly)."""
        for a in list(args) + list(kwargs.values()):
            if isinstance(a, torch.Tensor) and a.device.type != "cuda":
                raise ValueError(f"CudaGraphRunner needs device tensors, got one on {a.device}")
        t0 = time.perf_counter()
        try:
            captured = self._capture_once(args, kwargs)
        except Exception as exc:  # noqa: BLE001 - retried once, then re-raised
            self.failed_captures += 1
            logger.warning("CUDA graph capture failed (%s); synchronising and capturing again",
                           str(exc).splitlines()[0][:300])
            torch.cuda.synchronize()
            captured = self._capture_once(args, kwargs)
        self.capture_seconds.append(time.perf_counter() - t0)
        logger.info("captured graph %d in %.2f s (compiled step: %s)", len(self._graphs) + 1,
                    self.capture_seconds[-1], self.compiles)
        return captured

    def _capture_once(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Captured:
        # Private copies: the caller's tensors may be freed or reused between steps.
        static_args = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
        static_kwargs = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                self.fn(*static_args, **static_kwargs)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: the engine captures on its worker thread while the scheduler thread runs Python
        # (no CUDA calls); "global" would also fail on harmless calls made by other threads.
        with torch.cuda.graph(graph, pool=self._pool, stream=_capture_stream(), capture_error_mode="thread_local"):
            out = self.fn(*static_args, **static_kwargs)
        if self._pool is None:
            self._pool = graph.pool()
        return _Captured(graph, static_args, static_kwargs, out)
