"""Compiled decode steps (``DEEPINFER_NV_COMPILE=1``) against eager ones on a CUDA device (not a pytest file).

    DEEPINFER_NV_COMPILE=1 python3 -m deepinfer_nvidia.tests.compiled_step_check

Tiny V4.1 "flash" checkpoint (MXFP4 experts), fp32 and bf16, 4 requests: one prefill step, then 6 decode steps
through the executor's graph path (``NvidiaPlatform().graph_runner``: the compiled step captured in a CUDA graph)
against the same steps with no graph runner. Prints the max |difference| of the hidden states per dtype, the
seconds the first graphed step took (the compile), and the graphed steps served. The CPU twin is
``tests/plugins/test_nvidia_compiled_step.py``.
"""
from __future__ import annotations

import tempfile
import time

import torch

from deepinfer_core.kernels.resolve import resolve_kernels
from deepinfer_core.runner.executor import STEP_KERNEL_OPS, PagedExecutor
from deepinfer_core.runner.simple_driver import run_requests
from deepinfer_models.deepseek_v41.checkpoint_writer import tiny_v41_config, write_tiny_v41_checkpoint
from deepinfer_models.deepseek_v41.loading import load_deepseek_v41
from deepinfer_nvidia.graphs import compile_enabled
from deepinfer_nvidia.platform import NvidiaPlatform


def main() -> None:
    print("compile enabled:", compile_enabled())
    path = tempfile.mkdtemp(prefix="deepinfer-compiled-")
    write_tiny_v41_checkpoint(path, tiny_v41_config("flash"), quant="fp4", seed=2)
    g = torch.Generator().manual_seed(0)
    lens = [5, 14, 30, 61]
    reqs = [torch.randint(3, 129000, (n + 6,), generator=g).tolist() for n in lens]
    schedule = [[(i, n) for i, n in enumerate(lens)]] + [[(i, 1) for i in range(len(lens))]] * 6
    for dtype in (torch.float32, torch.bfloat16):
        out, info = {}, {}
        for graphed in (False, True):
            platform = NvidiaPlatform()
            model = load_deepseek_v41(path, dtype=dtype, device="cuda", platform=platform)
            ex = PagedExecutor(model, num_blocks=256, max_num_seqs=8, graph_runner=platform.graph_runner if graphed
                               else None, graph_batch_sizes=(4,), max_context=256, device="cuda",
                               kernels=resolve_kernels(STEP_KERNEL_OPS, platform))
            t0 = time.time()
            out[graphed] = run_requests(ex, reqs, schedule)
            torch.cuda.synchronize()
            if graphed:
                info = dict(seconds=round(time.time() - t0, 1), steps=ex.graphs.steps if ex.graphs else 0,
                            disabled=ex.graphs.disabled_reason if ex.graphs else "no graphs")
        diff = max((out[True][i].float() - out[False][i].float()).abs().max().item() for i in out[False])
        print(f"{dtype}: max |graphed - eager| hidden {diff:.3g}; {info}")


if __name__ == "__main__":
    main()
