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

    # Async scheduling runs each step on the calling thread and plans the next one on the worker:
    # torch's CPU kernels use the OpenMP pool of the thread that calls them, and the thread that
    # loaded the model already owns one, so stepping on the worker would add a second pool (more
    # libgomp threads than cores: every wait becomes a futex sleep/wake; measured 3-4x slower on
    # 2 cores, docs/speculative_decoding.md "Async scheduling on the CPU").
    steps_on_calling_thread = True
