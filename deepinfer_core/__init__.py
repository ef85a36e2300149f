"""DeepInfer core: engine, scheduler, KV blocks, sampler, kernel registry and platforms.

``from deepinfer_core import LLM, SamplingParams`` is the offline API (vLLM names).
The heavy pieces are imported on first use so that ``import deepinfer_core`` stays light.
"""
from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "__version__"]


def __getattr__(name: str):
    if name == "LLM":
        from deepinfer_core.llm import LLM

        return LLM
    if name == "SamplingParams":
        from deepinfer_core.sampling_params import SamplingParams

        return SamplingParams
    if name in ("RequestOutput", "CompletionOutput"):
        from deepinfer_core import outputs

        return getattr(outputs, name)
    raise AttributeError(f"module 'deepinfer_core' has no attribute {name!r}")
