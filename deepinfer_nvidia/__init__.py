"""DeepInfer's ``nvidia`` platform plugin.

Core finds this package through the ``deepinfer.platforms`` entry point
``nvidia = "deepinfer_nvidia:detect"`` and calls :func:`detect`. Importing this
package is cheap: it imports neither torch nor triton. The platform class lives
in :mod:`deepinfer_nvidia.platform`; kernels register lazily from
:mod:`deepinfer_nvidia.kernels`.
"""
from __future__ import annotations

PLATFORM_TARGET = "deepinfer_nvidia.platform:NvidiaPlatform"

__all__ = ["PLATFORM_TARGET", "detect"]


def detect() -> str | None:
    """Return ``"deepinfer_nvidia.platform:NvidiaPlatform"`` when an NVIDIA GPU is usable, else None.

    Usable means: torch is a CUDA build (not ROCm, whose HIP devices also answer
    ``torch.cuda``) and it sees at least one device. torch is imported here, not
    at package import, so listing entry points stays free; triton is never
    imported here.
    """
    import torch

    if getattr(torch.version, "hip", None):
        return None  # a ROCm build: the devices are AMD GPUs, not ours
    if torch.version.cuda is None:
        return None  # a CPU-only build of torch
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return None
    return PLATFORM_TARGET
