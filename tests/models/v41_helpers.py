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

from deepinfer_models.deepseek_v41.checkpoint_writer import tiny_v41_config, write_tiny_v41_checkpoint
from tests.models.paged_checks import full_logits, prompt

torch.set_num_threads(1)

_ROOT = Path(tempfile.mkdtemp(prefix="deepinfer-v41-tests-"))
atexit.register(shutil.rmtree, _ROOT, ignore_errors=True)


@functools.lru_cache(maxsize=None)
def tiny_ckpt(topology: str = "flash", quant: str = "none", seed: int = 1) -> Path:
    """A read-only tiny V4.1 checkpoint directory."""
    return write_tiny_v41_checkpoint(_ROOT / f"{topology}-{quant}-{seed}", tiny_v41_config(topology), quant=quant,
                                     seed=seed)


__all__ = ["tiny_ckpt", "prompt", "full_logits"]  # prompt and full_logits: paged_checks', for the V4.1 tests
