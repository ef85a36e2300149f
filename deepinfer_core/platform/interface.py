"""The Platform contract: small, data-driven, vendor code lives in plugins.

Core branches on ``PlatformCapabilities`` fields, never on a vendor name.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch


@dataclass(frozen=True)
class PlatformCapabilities:
    """What a platform can do. Conservative defaults: nothing special."""

    fp8: bool = False
    fp4: bool = False
    graph_capture: bool = False
    deterministic_kernels: bool = True
    bf16: bool = True


class Platform:
    """Base class of every platform (``cpu`` built in; ``nvidia``/``ascend`` in plugins).

    A platform owns the device handle, memory queries, its capabilities, the
    distributed backend name, an optional graph runner and the registration of
    its kernels. Subclasses override what differs.
    """

    name: str = "base"
    device_type: str = "cpu"
    dist_backend: str = "gloo"
    capabilities: PlatformCapabilities = PlatformCapabilities()
    # Providers tried in order before the reference, e.g. ("triton",).
    default_providers: tuple[str, ...] = ()

    def device(self, index: int = 0) -> torch.device:
        return torch.device(self.device_type) if self.device_type == "cpu" else torch.device(self.device_type, index)

    def total_memory_bytes(self) -> int:
        """Memory the KV cache may be carved from (device memory, or host RAM for cpu)."""
        raise NotImplementedError

    def synchronize(self) -> None:
        """Wait for queued device work (no-op on the CPU)."""

    def register_kernels(self, registry: Any) -> None:
        """Register this platform's implementations (lazy ``module:attr`` targets)."""

    def graph_runner(self, fn: Callable[..., Any]) -> Callable[..., Any] | None:
        """A captured-graph wrapper for ``fn`` or None when graphs are unsupported."""
        return None

    def wrap_kernel(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """What a model keeps for a resolved kernel (``resolve_kernels``): ``fn`` itself unless the platform
        needs a wrapper (the nvidia platform hides kernels from ``torch.compile`` when it compiles steps)."""
        return fn

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, device_type={self.device_type!r})"
