"""FakePlatform: a CPU platform whose only difference is its own ``fake`` kernels."""
from __future__ import annotations

from typing import Any

from deepinfer_core.platform.interface import Platform, PlatformCapabilities

FAKE_MEMORY_BYTES = 3 << 30


class FakePlatform(Platform):
    name = "fake"
    device_type = "cpu"
    dist_backend = "gloo"
    capabilities = PlatformCapabilities(fp8=False, fp4=False, graph_capture=False, deterministic_kernels=True)
    default_providers = ("fake",)

    def total_memory_bytes(self) -> int:
        """A fixed 3 GiB, so tests can tell this platform's answer from the cpu platform's."""
        return FAKE_MEMORY_BYTES

    def register_kernels(self, registry: Any) -> None:
        registry.register_impl("norm.rms", "fake", "deepinfer_fake_platform.kernels:rms_norm")
