"""Median GPU time of a function replayed from a CUDA graph, for the device benchmarks (not a pytest file)."""
from __future__ import annotations

import torch


def graph_us(fn, calls: int = 1, warmup: int = 10, rep: int = 60, mode: str = "median") -> float:
    """us a call of ``fn()``: a CUDA graph holding ``calls`` back-to-back calls is replayed by ``do_bench``
    (``mode``: its ``return_mode``) and its time divided by ``calls``. Several calls spread the graph's own launch cost the way a
    graphed decode step does, and with programmatic dependent launch each call's prologue overlaps the one
    before. ``fn`` runs once eagerly first (compilation, allocator warm-up)."""
    from triton.testing import do_bench

    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    torch.cuda.synchronize()
    return do_bench(graph.replay, warmup=warmup, rep=rep, return_mode=mode) * 1e3 / calls
