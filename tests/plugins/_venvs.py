"""Build the repository's wheels and install them into throwaway environments.

Used by the plugin and packaging tests. Everything happens under a pytest tmp
directory; the working tree is never written to:

- ``stage_packages`` copies package directories (without caches, old builds or
  device tests) side by side, because each distribution's pyproject discovers
  its package one level up (``where = [".."]``);
- ``build_wheels`` runs one ``pip wheel --no-deps --no-build-isolation --no-index``
  over the staged directories (offline, and no second copy of setuptools);
- ``LayeredVenv`` is a venv without pip whose ``site-packages`` comes first and
  the current environment's ``site-packages`` after it (through a ``.pth`` file),
  so torch and friends are shared but what we install there wins. This is what
  ``python -m venv --system-site-packages`` would give, except that option points
  at the *base* interpreter, which has no torch when the tests run in a venv.
"""
from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import venv
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
FAKE_PLATFORM_DIR = Path(__file__).resolve().parent / "fake_platform"

_IGNORE = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "dist", "tests", ".*")


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=kw.pop("timeout", 300), **kw)
    if proc.returncode != 0:
        raise AssertionError(f"command failed ({proc.returncode}): {' '.join(map(str, cmd))}\n"
                             f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}")
    return proc


def stage_packages(dest: Path, sources: list[Path]) -> list[Path]:
    """Copy each source package directory into ``dest`` (side by side); return the copies."""
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for src in sources:
        target = dest / src.name
        shutil.copytree(src, target, ignore=_IGNORE)
        out.append(target)
    return out


def build_wheels(project_dirs: list[Path], wheel_dir: Path) -> dict[str, Path]:
    """Build one wheel per project directory; return {distribution-name: wheel path}."""
    wheel_dir.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
          "--wheel-dir", str(wheel_dir), *map(str, project_dirs)])
    wheels = {}
    for whl in sorted(wheel_dir.glob("*.whl")):
        dist = whl.name.split("-")[0].replace("_", "-")
        wheels[dist] = whl
    return wheels


def clean_env(**overrides: str | None) -> dict[str, str]:
    """The current environment minus DeepInfer's and Python's path variables, plus ``overrides``.

    An override of None removes the variable.
    """
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("DEEPINFER_") and k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


class LayeredVenv:
    """A venv whose own site-packages shadows the current environment's (see module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        venv.EnvBuilder(with_pip=False, symlinks=os.name != "nt").create(root)
        self.python = root / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
        self.site_packages = Path(_run([str(self.python), "-c",
                                        "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
        parent = [p for p in site.getsitepackages() if Path(p).is_dir()]
        # Plain path lines: the parent's own .pth files (editable installs of this
        # repository among them) are deliberately NOT processed here.
        (self.site_packages / "_deepinfer_parent_env.pth").write_text("\n".join(parent) + "\n")

    def install(self, *wheels: Path) -> None:
        """Install wheels into this venv only, ignoring copies visible from the parent environment."""
        _run([str(self.python), "-m", "pip", "install", "--no-deps", "--no-index", "--no-compile",
              "--ignore-installed", "--disable-pip-version-check", "-q", *map(str, wheels)])

    def run(self, code: str, *args: str, env: dict[str, str] | None = None,
            check: bool = True) -> subprocess.CompletedProcess:
        """Run ``python -c code args...`` in this venv, from a directory outside the repository."""
        cmd = [str(self.python), "-c", code, *args]
        kw = dict(cwd=self.root, env=env if env is not None else clean_env())
        if check:
            return _run(cmd, **kw)
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)
