"""The ``ascend`` platform: NPU device handles, memory, capabilities, HCCL.

Written against torch_npu's public API (``torch.npu.*``, registered when
``torch_npu`` is imported). Not run in this repository's CI: there is no NPU
there and torch_npu does not install. Only :func:`capabilities_for` and the
class attributes are checked on the CPU.
"""
from __future__ import annotations

import logging
from typing import Any

import torch

from deepinfer_core.platform.interface import Platform, PlatformCapabilities
from deepinfer_core.platform.loader import PlatformNotAvailableError

logger = logging.getLogger(__name__)


def capabilities_for(device_name: str) -> PlatformCapabilities:
    """Capabilities of the NPU that ``torch.npu.get_device_name()`` calls ``device_name``.

    fp8 and fp4 (MXFP8/MXFP4) matmul units exist from the Ascend 950 family on;
    earlier chips (910B/910C) run those checkpoints through dequantising
    references. Graph capture stays off until this plugin ships a graph runner.
    """
    if not isinstance(device_name, str) or not device_name:
        raise ValueError(f"device_name must be a non-empty string such as 'Ascend950PR', got {device_name!r}")
    is_950 = device_name.replace(" ", "").lower().startswith("ascend950")
    return PlatformCapabilities(fp8=is_950, fp4=is_950, graph_capture=False, bf16=True)


class AscendPlatform(Platform):
    """One process's view of its Ascend NPU (the current ``npu`` device)."""

    name = "ascend"
    device_type = "npu"
    dist_backend = "hccl"
    # AscendC kernels of this plugin first, then fused ops shipped by torch_npu.
    default_providers = ("ascendc", "torch_npu")

    def __init__(self) -> None:
        try:
            import torch_npu  # noqa: F401  (registers torch.npu and the "npu" device type)
        except ImportError as exc:
            raise PlatformNotAvailableError(f"the ascend platform needs torch_npu: {exc}") from exc
        if not torch.npu.is_available():
            raise PlatformNotAvailableError("the ascend platform needs an NPU, and torch_npu sees none")
        self.index = torch.npu.current_device()
        self.device_name: str = torch.npu.get_device_name(self.index)
        self.capabilities = capabilities_for(self.device_name)

    def total_memory_bytes(self) -> int:
        """Total memory of the current NPU in bytes (the total of ``torch.npu.mem_get_info``)."""
        _free, total = torch.npu.mem_get_info(self.index)
        return int(total)

    def synchronize(self) -> None:
        """Block until all queued work on the current NPU has finished."""
        torch.npu.synchronize(self.index)

    def register_kernels(self, registry: Any) -> None:
        """Register the torch_npu / AscendC implementations, lazily."""
        from deepinfer_ascend.kernels import register

        done = register(registry)
        logger.info("ascend: registered %d kernel implementations", len(done))

    def __repr__(self) -> str:
        return f"AscendPlatform(device={self.device_name!r}, npu:{self.index})"
