"""Resolve a model's ops to callables once, at load time."""
from __future__ import annotations

import logging
from typing import Callable, Iterable

from deepinfer_core.kernels.registry import KernelRegistry, get_registry
from deepinfer_core.kernels.spec import REFERENCE

logger = logging.getLogger(__name__)


def resolve_kernels(names: Iterable[str], platform=None, overrides: dict[str, str] | None = None,
                    registry: KernelRegistry | None = None) -> dict[str, Callable]:
    """``{op: callable}`` for ``names``; order: overrides, platform.default_providers, reference.

    Logs the chosen provider of every op once. The result is what layers keep: each callable passed through
    the platform's ``wrap_kernel`` where it has one (the nvidia platform makes kernels opaque to
    ``torch.compile`` when it compiles steps; identity otherwise).

    A fused op (``OpSpec.components``) that no preferred provider implements is built by its ``compose`` from
    its components as resolved here (logged as ``composed``), not from their references; its components are
    resolved (and returned) with it.
    """
    reg = registry or get_registry()
    if platform is not None:
        ensure_platform_kernels(reg, platform)
    preferred = tuple(getattr(platform, "default_providers", ()) or ())
    wrap = getattr(platform, "wrap_kernel", None)
    table: dict[str, Callable] = {}
    chosen: dict[str, str] = {}
    wanted, todo = set(), list(names)
    while todo:  # the ops named, their components, and theirs (a fused op may be made of fused ops)
        name = todo.pop()
        if name not in wanted:
            wanted.add(name)
            todo.extend(reg.op(name).components)
    for name in _components_first(reg, wanted):
        provider, fn = reg.resolve(name, preferred, overrides)
        spec = reg.op(name)
        if provider == REFERENCE and spec.compose is not None:
            table[name] = spec.compose({c: table[c] for c in spec.components})  # the parts are wrapped already
            chosen[name] = "composed"
            continue
        table[name] = wrap(fn) if wrap is not None else fn
        chosen[name] = provider
    logger.info("kernels: %s", ", ".join(f"{k}={v}" for k, v in chosen.items()))
    return table


def _components_first(reg: KernelRegistry, names: set[str]) -> list[str]:
    """``names`` ordered so every fused op comes after its components (plain ops first, each group sorted)."""
    order: list[str] = sorted(n for n in names if reg.op(n).compose is None)
    placed = set(order)
    fused = sorted(n for n in names if n not in placed)
    while fused:
        ready = [n for n in fused if placed.issuperset(reg.op(n).components)]
        if not ready:
            raise ValueError(f"fused ops whose components never resolve (a cycle?): {fused}")
        order += ready
        placed.update(ready)
        fused = [n for n in fused if n not in placed]
    return order


def ensure_platform_kernels(registry: KernelRegistry, platform) -> None:
    """Let ``platform`` register its implementations into ``registry`` exactly once."""
    done = registry.__dict__.setdefault("_platforms_registered", set())
    if platform.name not in done:
        platform.register_kernels(registry)
        done.add(platform.name)
