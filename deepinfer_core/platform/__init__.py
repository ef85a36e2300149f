"""Platforms: the only place in core allowed to name a device type."""
from deepinfer_core.platform.interface import Platform, PlatformCapabilities
from deepinfer_core.platform.loader import PlatformNotAvailableError, current_platform, load_platform

__all__ = ["Platform", "PlatformCapabilities", "PlatformNotAvailableError", "current_platform", "load_platform"]
