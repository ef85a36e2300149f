"""Helpers shared by the boundary tests: which source files and modules exist on disk.

Walking the file system (rather than ``pkgutil.walk_packages``) means a new
module is covered the moment it is written, even inside a folder that still
lacks its ``__init__.py`` (tests/plugins/test_wheels.py reports that case).
"""
from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

# Folders that hold no shipped source: caches, build outputs, device-only tests.
SKIP_DIRS = {"__pycache__", "build", "dist", "tests"}


def _skipped(part: str) -> bool:
    return part in SKIP_DIRS or part.startswith(".") or part.endswith(".egg-info")


def source_files(package: str) -> list[Path]:
    """Every shipped ``.py`` file under the top-level package directory ``package``."""
    root = REPO_ROOT / package
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(REPO_ROOT)
        if any(_skipped(part) for part in rel.parts[:-1]):
            continue
        files.append(path)
    return files


def module_name(path: Path) -> str:
    """Dotted module name of a source file below the repository root."""
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def module_names(package: str) -> list[str]:
    """Dotted names of every module and package of ``package`` found on disk (package first)."""
    names = {package}
    names.update(module_name(p) for p in source_files(package))
    return sorted(names)
