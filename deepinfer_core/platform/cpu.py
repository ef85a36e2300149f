"""The built-in CPU platform: reference kernels only. The CI default."""
from __future__ import annotations

import os

from deepinfer_core.platform.interface import Platform, PlatformCapabilities


class CpuPlatform(Platform):
    name = "cpu"
    device_type = "cpu"
    dist_backend = "gloo"
    capabilities = PlatformCapabilities(fp8=False, fp4=False, graph_capture=False, deterministic_kernels=True)

    def total_memory_bytes(self) -> int:
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):  # pragma: no cover - exotic hosts
            return 8 << 30
