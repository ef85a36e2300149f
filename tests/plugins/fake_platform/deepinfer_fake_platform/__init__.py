"""A test platform plugin on the CPU: ``fake = "deepinfer_fake_platform:detect"``.

Two environment switches let tests drive the loader's failure paths with a
real installed plugin: ``DEEPINFER_FAKE_PLATFORM_ABSENT=1`` makes ``detect()``
report no device, ``DEEPINFER_FAKE_PLATFORM_BROKEN=1`` makes it raise.
"""
from __future__ import annotations

import os

PLATFORM_TARGET = "deepinfer_fake_platform.platform:FakePlatform"


def detect() -> str | None:
    """Return the FakePlatform qualname unless a test switched the fake device off."""
    if os.environ.get("DEEPINFER_FAKE_PLATFORM_BROKEN") == "1":
        raise RuntimeError("fake platform detect() was told to break")
    if os.environ.get("DEEPINFER_FAKE_PLATFORM_ABSENT") == "1":
        return None
    return PLATFORM_TARGET
