"""NVIDIA kernel implementations, registered lazily into core's KernelRegistry.

Each entry of :data:`IMPLS` is ``(op, provider, "module:attr", supports)``:
metadata only. Nothing under this package is imported until the registry
resolves an op to one of these providers, so registering never imports triton.
One provider family per module (``triton_norm.py``, ``flashmla.py``, ...).

No kernels exist yet: every op resolves to core's ``reference`` on this
platform until a module is added here and listed in :data:`IMPLS`.
"""
from __future__ import annotations

from typing import Any

# (op, provider, target, supports-target or None). Providers are tried in the
# order of NvidiaPlatform.default_providers.
IMPLS: tuple[tuple[str, str, str, str | None], ...] = ()


def register(registry: Any) -> list[tuple[str, str]]:
    """Register every NVIDIA implementation in ``registry`` (a KernelRegistry).

    Returns the ``(op, provider)`` pairs registered, for the platform's log line.
    Raises whatever the registry raises for an unknown op or a duplicate
    (op, provider): both are packaging bugs that must not pass silently.
    """
    done = []
    for op, provider, target, supports in IMPLS:
        registry.register_impl(op, provider, target, supports)
        done.append((op, provider))
    return done
