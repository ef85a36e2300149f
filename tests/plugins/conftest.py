"""Fixtures for the plugin tests: wheels built once per session, and the fake plugin importable."""
from __future__ import annotations

import sys

import pytest

from tests.plugins._venvs import FAKE_PLATFORM_DIR, REPO_ROOT, build_wheels, stage_packages

SHIPPED = ("deepinfer_core", "deepinfer_models", "deepinfer_nvidia", "deepinfer_ascend")

# In-process tests import the fake plugin straight from its source folder; the
# entry-point tests install it properly into a throwaway environment instead.
if str(FAKE_PLATFORM_DIR) not in sys.path:
    sys.path.insert(0, str(FAKE_PLATFORM_DIR))


@pytest.fixture(scope="session")
def wheels(tmp_path_factory) -> dict:
    """{distribution name: wheel path} for the four shipped distributions and the fake plugin."""
    for pkg in SHIPPED:
        if not (REPO_ROOT / pkg / "__init__.py").is_file():
            pytest.fail(f"{pkg}/__init__.py is missing: setuptools ships only regular packages, "
                        f"so the {pkg} wheel would be empty")
    root = tmp_path_factory.mktemp("wheelhouse")
    staged = stage_packages(root / "stage", [REPO_ROOT / p for p in SHIPPED] + [FAKE_PLATFORM_DIR])
    built = build_wheels(staged, root / "dist")
    expected = {"deepinfer-core", "deepinfer-models", "deepinfer-nvidia", "deepinfer-ascend", "deepinfer-fake-platform"}
    assert set(built) == expected, f"built {sorted(built)}, expected {sorted(expected)}"
    return built
