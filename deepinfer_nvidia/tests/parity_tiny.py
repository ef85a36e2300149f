"""Greedy tokens and logits on the GPU (nvidia providers) vs the CPU reference platform.

    python3 -m deepinfer_nvidia.tests.parity_tiny        # needs a CUDA device

Tiny generated DeepSeek-V4 checkpoints (fp8 layout), three prompts that cross the window and
both compression ratios; 24 greedy tokens each through the paged decode path. fp32 activations:
tokens must match exactly and logits within 1e-3 (TF32 is off).

bf16: this tiny random model is chaotic under bf16 rounding. The CPU reference's own bf16 logits differ from
its fp32 logits by ~0.24 (max |logit| ~5), and its bf16 tokens leave the fp32 ones after 1-2 steps (measured on
the CPU, docs/performance.md, tenth pass). So a fixed absolute tolerance between two bf16 runs says little. The
bf16 check is instead against the fp32 truth: the GPU's bf16 error, max|GPU bf16 - CPU fp32|, must be at most
``BF16_ERROR_RATIO`` times the reference's own bf16 error, max|CPU bf16 - CPU fp32|. The GPU-vs-CPU bf16
difference is printed too.
"""
from __future__ import annotations

import os
import tempfile

import torch

from deepinfer_core.runner.executor import PagedExecutor
from deepinfer_core.runner.simple_driver import SimpleBlockAllocator
from deepinfer_core.runner.context import SeqSlice
from deepinfer_models.deepseek_v4.loading import load_deepseek_v4
from deepinfer_models.testing import write_tiny_v4_checkpoint

OVERRIDES = {"gemm.dense": "aten", "moe.experts": "aten"}
BF16_ERROR_RATIO = 1.5


def greedy(model, prompts, n, device) -> tuple[list[list[int]], list[torch.Tensor]]:
    """``n`` greedy tokens per prompt through the paged path, and every step's logits ([prompts, vocab] fp32 on
    the CPU; the first step's is the prefill's)."""
    ex = PagedExecutor(model, 512, len(prompts), device)
    alloc = SimpleBlockAllocator(ex)
    seqs = [list(p) for p in prompts]
    done = [0] * len(prompts)
    steps = []
    for _ in range(n):
        slices, ids = [], []
        for i, s in enumerate(seqs):
            slices.append(SeqSlice(done[i], len(s) - done[i], alloc.tables_for(i, len(s)), i))
            ids += s[done[i]:]
        hidden = ex.run(torch.tensor(ids), slices)
        ends = torch.cumsum(torch.tensor([sl.num_tokens for sl in slices]), 0) - 1
        logits = model.compute_logits(hidden[ends.to(hidden.device)]).float().cpu()
        steps.append(logits)
        for i, s in enumerate(seqs):
            done[i] = len(s)
            s.append(int(logits[i].argmax()))
    return [s[len(p):] for s, p in zip(seqs, prompts)], steps


def main() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    from deepinfer_nvidia.platform import NvidiaPlatform  # direct: the plugin may not be pip-installed here

    gpu = NvidiaPlatform()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 129000, (n,), generator=g).tolist() for n in (20, 140, 260)]
    d = tempfile.mkdtemp()
    write_tiny_v4_checkpoint(d, quant="fp8", seed=1, tokenizer=False)
    truth = None  # CPU fp32 first-step logits
    failed = []
    for dtype, tol in ((torch.float32, 1e-3), (torch.bfloat16, None)):
        os.environ["DEEPINFER_KERNELS"] = "reference"
        cpu_model = load_deepseek_v4(d, dtype=dtype, device="cpu")
        os.environ.pop("DEEPINFER_KERNELS")
        gpu_model = load_deepseek_v4(d, dtype=dtype, device=gpu.device(), platform=gpu, kernel_overrides=OVERRIDES)
        with torch.inference_mode():
            t_cpu, (l_cpu, *_) = greedy(cpu_model, prompts, 24, "cpu")
            t_gpu, (l_gpu, *_) = greedy(gpu_model, prompts, 24, gpu.device())
        same = [a == b for a, b in zip(t_cpu, t_gpu)]
        agree = [sum(x == y for x, y in zip(a, b)) for a, b in zip(t_cpu, t_gpu)]
        diff = (l_cpu - l_gpu).abs().max().item()
        scale = l_cpu.abs().max().item()
        print(f"{str(dtype):15} greedy tokens identical per prompt: {same} (agreeing {agree}/24); "
              f"first-step logits max|GPU - CPU| {diff:.2e} (max|logit| {scale:.2f})")
        if tol is not None:
            truth = l_cpu
            if not all(same) or diff > tol:
                failed.append(f"{dtype}: tokens {same}, logits {diff:.2e} > {tol:g}")
        else:
            err_gpu = (l_gpu - truth).abs().max().item()
            err_cpu = (l_cpu - truth).abs().max().item()
            ok = err_gpu <= BF16_ERROR_RATIO * err_cpu
            print(f"{'':15} against CPU fp32: GPU bf16 error {err_gpu:.3e}, CPU reference bf16 error {err_cpu:.3e} "
                  f"(ratio {err_gpu / max(err_cpu, 1e-30):.2f}, bound {BF16_ERROR_RATIO}): {'ok' if ok else 'FAIL'}")
            if not ok:
                failed.append(f"bf16 error {err_gpu:.3e} > {BF16_ERROR_RATIO} x {err_cpu:.3e}")
    if failed:
        raise SystemExit("parity failed: " + "; ".join(failed))
    print("parity ok")


if __name__ == "__main__":
    main()
