"""Architectures DeepInfer can run, and the embedded tiny default checkpoints.

Core finds this module through the ``deepinfer.models`` entry point (or by name
when running from a source tree); it never imports deepinfer_models statically.
"""
from __future__ import annotations

from pathlib import Path

# architecture name in config.json -> "module:loader" (loader(model_dir, dtype=, device=, platform=, **kw))
MODEL_REGISTRY: dict[str, str] = {
    "DeepseekV41ForCausalLM": "deepinfer_models.deepseek_v41.loading:load_deepseek_v41",
    "DeepseekV4ForCausalLM": "deepinfer_models.deepseek_v4.loading:load_deepseek_v4",
}

# The chat encoding (deepseek-recipe) each architecture's prompts use.
CHAT_ENCODING: dict[str, str] = {
    "DeepseekV41ForCausalLM": "v41",
    "DeepseekV4ForCausalLM": "v4",
}

# The default embedded checkpoint is a tiny V4.1 (DeepInfer's model family); tiny V4 stays available.
EMBEDDED_V41 = "deepinfer/tiny-v41"
EMBEDDED_V4 = "deepinfer/tiny-v4"
EMBEDDED_DEFAULT = EMBEDDED_V41


def _build_tiny_v41(out_dir: Path) -> None:
    from deepinfer_models.deepseek_v41.checkpoint_writer import write_tiny_v41_checkpoint

    write_tiny_v41_checkpoint(out_dir, quant="fp8", seed=0)


def _build_tiny_v4(out_dir: Path) -> None:
    from deepinfer_models.deepseek_v4.checkpoint_writer import write_tiny_v4_checkpoint

    write_tiny_v4_checkpoint(out_dir, quant="fp8", seed=0)


# first entry = the default embedded checkpoint
EMBEDDED_BUILDERS = {EMBEDDED_V41: _build_tiny_v41, EMBEDDED_V4: _build_tiny_v4}


def register_embedded() -> None:
    """Register the tiny generated checkpoints with core's hub resolver (idempotent)."""
    from deepinfer_core.hub import embedded_model_names, register_embedded_model

    for name, builder in EMBEDDED_BUILDERS.items():
        if name not in embedded_model_names():
            register_embedded_model(name, builder, version="1")


def write_default_tiny(out_dir: str | Path, quant: str = "fp8", seed: int = 0, family: str = "v41") -> Path:
    """Write the default tiny checkpoint (used by ``deepinfer make-tiny``): V4.1, or V4 with ``family="v4"``."""
    if family == "v41":
        from deepinfer_models.deepseek_v41.checkpoint_writer import write_tiny_v41_checkpoint

        return write_tiny_v41_checkpoint(Path(out_dir), quant=quant, seed=seed)
    if family == "v4":
        from deepinfer_models.deepseek_v4.checkpoint_writer import write_tiny_v4_checkpoint

        return write_tiny_v4_checkpoint(Path(out_dir), quant=quant, seed=seed)
    raise ValueError(f"family must be 'v41' or 'v4', got {family!r}")
