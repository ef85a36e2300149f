"""Test and benchmark helpers: tiny native DeepSeek-V4 checkpoints.

``write_tiny_v4_checkpoint(tmp_path)`` gives a real-layout checkpoint (config,
safetensors, tokenizer) small enough for CPU tests; ``tiny_v4_config()`` is its
default shape.
"""
from deepinfer_models.deepseek_v4.checkpoint_writer import (
    QUANT_PRESETS,
    make_tensors,
    tiny_v4_config,
    write_tiny_v4_checkpoint,
)
from deepinfer_models.deepseek_v4.weights import SKIP_PREFIXES, expected_tensors

__all__ = ["tiny_v4_config", "write_tiny_v4_checkpoint", "make_tensors", "expected_tensors", "QUANT_PRESETS",
           "SKIP_PREFIXES"]
