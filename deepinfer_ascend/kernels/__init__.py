"""Ascend kernel implementations, registered lazily into core's KernelRegistry.

Each entry of :data:`IMPLS` is ``(op, provider, "module:attr", supports)``:
metadata only, so registering never imports torch_npu's custom-op libraries.
One provider family per module: ``torch_npu`` for fused ops that torch_npu
ships (e.g. ``torch_npu.npu_rms_norm``), ``ascendc`` for this plugin's own
AscendC kernels.

No kernels exist yet: every op resolves to core's ``reference`` on this
platform until a module is added here and listed in :data:`IMPLS`.
"""
from __future__ import annotations

from typing import Any

# (op, provider, target, supports-target or None).
IMPLS: tuple[tuple[str, str, str, str | None], ...] = ()


def register(registry: Any) -> list[tuple[str, str]]:
    """Register every Ascend implementation in ``registry`` (a KernelRegistry).

    Returns the ``(op, provider)`` pairs registered. An unknown op or a
    duplicate (op, provider) raises, as the registry decides.
    """
    done = []
    for op, provider, target, supports in IMPLS:
        registry.register_impl(op, provider, target, supports)
        done.append((op, provider))
    return done
