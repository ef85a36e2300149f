"""Which captures break with programmatic dependent launch (device probe, twentieth pass).

1. Small captures: a PDL-launched RMSNorm after each kind of predecessor node (a D2D memcpy, a memset, a torch
   kernel, a cuBLAS GEMM, nothing (first node), a cross-stream event wait), captured and replayed.
2. The tiny V4.1 engine with ``_common.PDL = 1``: every ``pdl_launch`` call records the caller and whether the
   stream was still capturing, so the first launch after the capture was invalidated names the culprit.

    DEEPINFER_ACCELERATOR=nvidia python3 -m deepinfer_nvidia.tests.pdl_probe
"""
from __future__ import annotations

import ctypes
import importlib
import pkgutil
import sys
import tempfile
import traceback

import torch

from deepinfer_nvidia.kernels import _common, triton_norm, triton_pdl


def _small_captures() -> None:
    _common.PDL = 1
    x = torch.randn(4, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    a = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()

    def before(kind):
        if kind == "memcpy":
            y.copy_(x)
        elif kind == "memset":
            y.zero_()
            torch.zeros(1024, device="cuda")
        elif kind == "kernel":
            y.mul_(0.5)
        elif kind == "cublas":
            (a @ a).sum()
        elif kind == "event":
            ev = torch.cuda.Event()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                y.add_(1)
                ev.record()
            torch.cuda.current_stream().wait_event(ev)

    for kind in ("first", "memcpy", "memset", "kernel", "cublas", "event"):
        try:
            for _ in range(2):
                before(kind)
                triton_norm.rms(x, w, 1e-6)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                before(kind)
                out = triton_norm.rms(x, w, 1e-6)
                out2 = triton_norm.rms(out, w, 1e-6)
            g.replay()
            torch.cuda.synchronize()
            want = triton_norm.rms(triton_norm.rms(x, w, 1e-6), w, 1e-6)
            print(f"capture after {kind}: ok, equal {torch.equal(out2, want)}")
        except Exception as exc:  # noqa: BLE001
            print(f"capture after {kind}: FAILED {type(exc).__name__}: {str(exc)[:200]}")
            torch.cuda.synchronize()


def _requests():
    from deepinfer_core import SamplingParams

    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 1000, (n,), generator=g).tolist() for n in (5, 40, 90, 13, 70, 9)]
    params = [SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=3),
              SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=16, ignore_eos=True, logprobs=1)] * 3
    return prompts, params


def _report(log) -> None:
    """The launches just before the first one that found the capture invalidated (status 2)."""
    bad = next((i for i, (_, status) in enumerate(log) if status == 2), None)
    print("launches traced:", len(log), "while capturing:", sum(c == 1 for _, c in log), "first invalidated:", bad)
    if bad is not None:
        print("  launches before:", log[max(0, bad - 8):bad + 1])
    log.clear()


def _capture_status() -> int:
    """cuStreamIsCapturing of the current stream: 0 none, 1 active, 2 invalidated (a launch failed)."""
    status = ctypes.c_int(-1)
    ctypes.CDLL("libcuda.so.1").cuStreamIsCapturing(ctypes.c_void_p(torch.cuda.current_stream().cuda_stream),
                                                    ctypes.byref(status))
    return status.value


LOG: list[tuple[str, int]] = []


def _trace_launches() -> None:
    """Every module's ``pdl_launch`` records its caller and the stream's capture status first."""
    import deepinfer_nvidia.kernels as kernels

    for info in pkgutil.iter_modules(kernels.__path__):
        importlib.import_module(f"deepinfer_nvidia.kernels.{info.name}")
    real = triton_pdl.pdl_launch

    def traced():
        caller = sys._getframe(1)
        LOG.append((f"{caller.f_code.co_filename.rsplit('/', 1)[-1]}:{caller.f_lineno}", _capture_status()))
        return real()

    for mod in list(sys.modules.values()):
        if mod is not triton_pdl and getattr(mod, "pdl_launch", None) is real:
            mod.pdl_launch = traced


def _engine(sizes=(1,), off_first: bool = False) -> None:
    from deepinfer_core import LLM
    from deepinfer_models.deepseek_v41.checkpoint_writer import tiny_v41_config, write_tiny_v41_checkpoint
    from deepinfer_nvidia.platform import NvidiaPlatform

    log = LOG
    path = write_tiny_v41_checkpoint(tempfile.mkdtemp() + "/v41", tiny_v41_config("mixed"), quant="fp4", seed=2)

    def make():
        return LLM(str(path), dtype="bfloat16", max_model_len=512, max_num_seqs=8, kv_cache_memory_bytes=1 << 30,
                   max_num_batched_tokens=4096, platform=NvidiaPlatform(), graph_capture_sizes=list(sizes))

    print(f"-- engine: capture sizes {list(sizes)}, a PDL-off engine first: {off_first}")
    if off_first:
        _common.PDL = 0
        first = make()
        first.generate(*_requests(), use_tqdm=False)
        del first
        torch.cuda.synchronize()
    log.clear()
    _common.PDL = 1
    llm = make()
    _report(log)
    print("graph steps after generate:", end=" ")
    llm.generate(*_requests(), use_tqdm=False)
    _report(log)
    print(llm.llm_engine.executor.graphs.steps)
    del llm
    torch.cuda.synchronize()


if __name__ == "__main__":
    import functools
    _trace_launches()
    parts = [functools.partial(_engine, (1, 2, 4, 8), True), functools.partial(_engine, (1, 2, 4, 8))]
    if "--small" in sys.argv:
        parts.insert(0, _small_captures)
    for part in parts:
        try:
            part()
        except Exception:  # noqa: BLE001
            traceback.print_exc()
