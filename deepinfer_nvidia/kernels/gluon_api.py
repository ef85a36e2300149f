"""The Gluon names the SM90 kernels use, imported once with the shims for the Triton versions we meet.

Gluon is experimental: absent in older Triton (``AVAILABLE`` is then False and none of the names below exist), and
renamed between 3.6 (the H200's) and later versions: the ``cp.async`` copy (``async_copy_global_to_shared`` ->
``async_load``), the CTA barrier (``barrier`` -> ``thread_barrier``), the TMA load and a shared view's
reinterpretation (``_reinterpret`` -> ``reinterpret``). Kernel modules import what they use from here inside
``if AVAILABLE:``; a ``@gluon.jit`` function resolves these as its module's globals.
"""
from __future__ import annotations

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_init,
        warpgroup_mma_wait,
    )

    cp_async = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
    cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
    tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    REINTERPRET_PUBLIC: gl.constexpr = gl.constexpr(hasattr(gl.shared_memory_descriptor, "reinterpret"))
    AVAILABLE = True
except ImportError:  # pragma: no cover - depends on the installed triton
    AVAILABLE = False

__all__ = ["AVAILABLE", "REINTERPRET_PUBLIC", "async_copy", "cp_async", "cta_barrier", "fence_async_shared", "gl",
           "gluon", "mbarrier", "tma", "tma_load", "warpgroup_mma", "warpgroup_mma_init", "warpgroup_mma_wait"]
