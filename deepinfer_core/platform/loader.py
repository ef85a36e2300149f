"""Platform discovery through the ``deepinfer.platforms`` entry-point group.

Each entry point names a ``detect()`` function that returns a ``"module:Class"``
string when its hardware and libraries are usable, else None. ``detect()`` must
be cheap: it must not import heavy vendor modules unless they are present.

Selection: ``DEEPINFER_ACCELERATOR`` if set (``cpu``, ``nvidia``, ``ascend``,
or any installed plugin's name), else the single detected platform, else cpu.
"""
from __future__ import annotations

import logging
import os
from importlib.metadata import entry_points

from deepinfer_core.kernels.spec import _load_target
from deepinfer_core.platform.interface import Platform

logger = logging.getLogger(__name__)

PLATFORM_GROUP = "deepinfer.platforms"
KERNEL_PACK_GROUP = "deepinfer.kernels"
ENV_ACCELERATOR = "DEEPINFER_ACCELERATOR"


class PlatformNotAvailableError(RuntimeError):
    """The requested accelerator is not installed or not usable on this machine."""


def installed_platforms() -> dict[str, object]:
    """name -> entry point, for every plugin in ``deepinfer.platforms`` (plus built-in cpu)."""
    found: dict[str, object] = {"cpu": None}
    for ep in entry_points(group=PLATFORM_GROUP):
        if ep.name in found:
            raise RuntimeError(f"two platform plugins are both named {ep.name!r} ({ep.value})")
        found[ep.name] = ep
    return found


def _detect(name: str, ep) -> tuple[str | None, str]:
    """Run a plugin's detect(); returns (qualname or None, reason when None)."""
    try:
        detect = ep.load()
        target = detect()
    except Exception as exc:  # a broken plugin must not take the process down
        return None, f"its detect() raised {type(exc).__name__}: {exc}"
    if target is None:
        return None, "its detect() found no usable device or runtime library"
    return target, ""


def _instantiate(target: str) -> Platform:
    cls = _load_target(target)
    platform = cls()
    if not isinstance(platform, Platform):
        raise TypeError(f"{target} is not a deepinfer_core Platform subclass")
    return platform


def load_platform(name: str | None = None) -> Platform:
    """Select and instantiate the platform (see module docstring for the rules)."""
    requested = name if name is not None else os.environ.get(ENV_ACCELERATOR, "").strip().lower() or None
    plugins = installed_platforms()
    if requested == "cpu":
        from deepinfer_core.platform.cpu import CpuPlatform

        return CpuPlatform()
    if requested is not None:
        if requested not in plugins:
            raise PlatformNotAvailableError(
                f"{ENV_ACCELERATOR}={requested!r} but no platform plugin named {requested!r} is installed; "
                f"installed platforms: {', '.join(sorted(plugins))}. "
                f"Install it (e.g. `pip install deepinfer-{requested}`) or unset {ENV_ACCELERATOR}."
            )
        target, why = _detect(requested, plugins[requested])
        if target is None:
            raise PlatformNotAvailableError(
                f"{ENV_ACCELERATOR}={requested!r}: the {requested!r} plugin is installed but unusable here: {why}. "
                f"Installed platforms: {', '.join(sorted(plugins))}."
            )
        return _instantiate(target)
    detected = []
    for pname, ep in plugins.items():
        if ep is None:
            continue
        target, _ = _detect(pname, ep)
        if target is not None:
            detected.append((pname, target))
    if len(detected) > 1:
        raise PlatformNotAvailableError(
            f"several platforms detected ({', '.join(n for n, _ in detected)}); set {ENV_ACCELERATOR} to choose one"
        )
    if detected:
        return _instantiate(detected[0][1])
    from deepinfer_core.platform.cpu import CpuPlatform

    return CpuPlatform()


def load_kernel_packs(registry) -> list[str]:
    """Let optional add-on packs (``deepinfer.kernels``) register providers."""
    names = []
    for ep in entry_points(group=KERNEL_PACK_GROUP):
        ep.load()(registry)
        names.append(ep.name)
    return names


_CURRENT: Platform | None = None


def current_platform() -> Platform:
    """The process-wide platform, selected on first use."""
    global _CURRENT
    if _CURRENT is None:
        _CURRENT = load_platform()
        logger.info("platform: %s", _CURRENT)
    return _CURRENT
