"""Fixtures shared by the device tests (``deepinfer_nvidia/tests``; they skip without a CUDA device)."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def nvidia_reg():
    """The process registry with the nvidia platform's implementations registered."""
    from deepinfer_core.kernels.registry import get_registry
    from deepinfer_core.kernels.resolve import ensure_platform_kernels
    from deepinfer_nvidia.platform import NvidiaPlatform

    r = get_registry()
    ensure_platform_kernels(r, NvidiaPlatform())
    return r
