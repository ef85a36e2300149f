"""DeepInfer's ``ascend`` platform plugin (Huawei Ascend NPUs through torch_npu / CANN).

Core finds this package through the ``deepinfer.platforms`` entry point
``ascend = "deepinfer_ascend:detect"``. Importing it is cheap; :func:`detect`
imports torch_npu only when it is installed. The platform class lives in
:mod:`deepinfer_ascend.platform`; kernels register lazily from
:mod:`deepinfer_ascend.kernels`.

Not run in this repository's CI (no NPU, and torch_npu is not installable on
its machines); the CPU side (detect() without torch_npu, packaging, the entry
point) is tested in ``tests/plugins/``.
"""
from __future__ import annotations

import importlib.util

PLATFORM_TARGET = "deepinfer_ascend.platform:AscendPlatform"

__all__ = ["PLATFORM_TARGET", "detect"]


def detect() -> str | None:
    """Return ``"deepinfer_ascend.platform:AscendPlatform"`` when an Ascend NPU is usable, else None.

    Usable means: torch_npu is installed and, once imported (which registers
    the ``torch.npu`` namespace and the ``npu`` device type), reports at least
    one available NPU. Without torch_npu this costs one ``find_spec`` and
    imports nothing.
    """
    if importlib.util.find_spec("torch_npu") is None:
        return None
    import torch
    import torch_npu  # noqa: F401  (import registers torch.npu)

    npu = getattr(torch, "npu", None)
    if npu is None or not npu.is_available() or npu.device_count() == 0:
        return None
    return PLATFORM_TARGET
