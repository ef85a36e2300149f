"""Batch invariance on the GPU: a request's logits, bit for bit, alone vs in a batch vs chunked.

    python3 -m deepinfer_nvidia.tests.invariance_tiny      # needs a CUDA device

Tiny V4.1 fp8 checkpoint, fp32 and bf16 activations; batch-invariant mode (only kernels registered
``batch_invariant=True``, references elsewhere) and default mode (all nvidia providers), reported.
"""
from __future__ import annotations

import tempfile

import torch

from deepinfer_core.kernels.mode import kernel_mode
from deepinfer_core.runner.executor import PagedExecutor
from deepinfer_core.runner.simple_driver import run_requests
from deepinfer_models.deepseek_v41.loading import load_deepseek_v41
from deepinfer_models.deepseek_v41.checkpoint_writer import write_tiny_v41_checkpoint

OVERRIDES = {"gemm.dense": "aten", "moe.experts": "aten"}


def logits_of(model, requests, schedule, dev):
    hidden = run_requests(PagedExecutor(model, 512, len(requests), dev), requests, schedule)
    return {i: model.compute_logits(h).float().cpu() for i, h in hidden.items()}


def main() -> None:
    from deepinfer_nvidia.platform import NvidiaPlatform

    gpu = NvidiaPlatform()
    dev = gpu.device()
    d = tempfile.mkdtemp()
    write_tiny_v41_checkpoint(d, quant="fp8", seed=2)
    g = torch.Generator().manual_seed(1)
    target = torch.randint(3, 129000, (150,), generator=g).tolist()
    others = [torch.randint(3, 129000, (n,), generator=g).tolist() for n in (7, 33, 90, 140, 5, 61, 120)]
    for dtype in (torch.float32, torch.bfloat16):
        for bi in (True, False):
            with kernel_mode(batch_invariant=bi):
                model = load_deepseek_v41(d, dtype=dtype, device=dev, platform=gpu,
                                          kernel_overrides=None if bi else OVERRIDES)
            with torch.inference_mode():
                alone = logits_of(model, [target], [[(0, 150)]] + [[(0, 1)]] * 0, dev)[0]
                batch = logits_of(model, others + [target], [[(i, len(p)) for i, p in enumerate(others + [target])]],
                                  dev)[len(others)]
                chunks = [[(0, 64)], [(0, 64)], [(0, 22)]]
                chunked = logits_of(model, [target], chunks, dev)[0]
            print(f"{str(dtype):15} batch_invariant={bi!s:5} alone==batch(8): {torch.equal(alone, batch)} "
                  f"(max|diff| {(alone - batch).abs().max().item():.1e}); alone==chunked(64+64+22): "
                  f"{torch.equal(alone, chunked)} (max|diff| {(alone - chunked).abs().max().item():.1e})")


if __name__ == "__main__":
    main()
