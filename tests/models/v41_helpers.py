"""Shared helpers of the V4.1 tests: tiny checkpoints written once per test process.

Writing a tiny V4.1 checkpoint takes a couple of seconds (the real 129280-token vocabulary),
so ``tiny_ckpt`` memoises by (topology, quant, seed) into one temporary directory that is
removed when the process exits; tests must treat these directories as read-only.
"""
from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

import torch

from deepinfer_core.runner.executor import PagedExecutor
from deepinfer_core.runner.simple_driver import run_requests
from deepinfer_models.deepseek_v41.checkpoint_writer import tiny_v41_config, write_tiny_v41_checkpoint

torch.set_num_threads(1)

_ROOT = Path(tempfile.mkdtemp(prefix="deepinfer-v41-tests-"))
atexit.register(shutil.rmtree, _ROOT, ignore_errors=True)


@functools.lru_cache(maxsize=None)
def tiny_ckpt(topology: str = "flash", quant: str = "none", seed: int = 1) -> Path:
    """A read-only tiny V4.1 checkpoint directory."""
    return write_tiny_v41_checkpoint(_ROOT / f"{topology}-{quant}-{seed}", tiny_v41_config(topology), quant=quant,
                                     seed=seed)


def prompt(n: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 129000, (n,), generator=g).tolist()


def full_logits(model, ids: list[int]) -> torch.Tensor:
    """Teacher-forced logits of one sequence, prefilled in a single step through the paged path."""
    ex = PagedExecutor(model, num_blocks=256, max_num_seqs=2)
    return model.compute_logits(run_requests(ex, [ids], [[(0, len(ids))]])[0])
