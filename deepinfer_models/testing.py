"""Test and benchmark helpers: tiny native DeepSeek-V4 and V4.1 checkpoints.

``write_tiny_v41_checkpoint(tmp_path)`` / ``write_tiny_v4_checkpoint(tmp_path)`` give real-layout
checkpoints (config, safetensors, tokenizer) small enough for CPU tests; ``tiny_v41_config()`` /
``tiny_v4_config()`` are their default shapes.
"""
from deepinfer_models.deepseek_v4.checkpoint_writer import (
    QUANT_PRESETS,
    make_tensors,
    tiny_v4_config,
    write_tiny_v4_checkpoint,
)
from deepinfer_models.deepseek_v4.weights import SKIP_PREFIXES, expected_tensors
from deepinfer_models.deepseek_v41.checkpoint_writer import tiny_v41_config, write_tiny_v41_checkpoint

__all__ = ["tiny_v4_config", "write_tiny_v4_checkpoint", "make_tensors", "expected_tensors", "QUANT_PRESETS",
           "SKIP_PREFIXES", "tiny_v41_config", "write_tiny_v41_checkpoint"]
