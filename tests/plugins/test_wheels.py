"""The four distributions build into clean wheels that install and work (ARCHITECTURE.md section 1).

`pip install deepinfer-core deepinfer-nvidia` must work from wheels built in
this repository: the wheels are built with ``pip wheel --no-deps
--no-build-isolation`` from staged copies of the package directories, installed
with ``--no-deps`` into a throwaway environment layered over this one (so torch
comes from here), and used from a directory outside the repository.
"""
from __future__ import annotations

import json
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
import torch

from tests.boundaries._tree import SKIP_DIRS
from tests.plugins._venvs import REPO_ROOT, LayeredVenv

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

pytestmark = pytest.mark.packaging

SHIPPED = {
    "deepinfer-core": "deepinfer_core",
    "deepinfer-models": "deepinfer_models",
    "deepinfer-nvidia": "deepinfer_nvidia",
    "deepinfer-ascend": "deepinfer_ascend",
}
# Files in a package directory that describe the distribution and must not ship
# (documentation, *.md, does not ship either).
NOT_SHIPPED = {"pyproject.toml"}


def _pyproject(path: Path) -> dict:
    return tomllib.loads(path.read_text(encoding="utf-8"))


def _on_disk(package: str) -> set[str]:
    """Files a wheel of ``package`` must contain, as archive paths ('deepinfer_core/x/y.py')."""
    root = REPO_ROOT / package
    found = set()
    for path in root.rglob("*"):
        rel = path.relative_to(REPO_ROOT)
        if not path.is_file() or path.suffix in (".pyc", ".md") or path.name in NOT_SHIPPED:
            continue
        if any(p in SKIP_DIRS or p.startswith(".") or p.endswith(".egg-info") for p in rel.parts[1:-1]):
            continue
        found.add(rel.as_posix())
    return found


def _wheel_files(whl: Path) -> tuple[set[str], dict[str, str]]:
    """(package files, {dist-info file name: text}) of a wheel."""
    with zipfile.ZipFile(whl) as z:
        names = z.namelist()
        info = {n.split("/", 1)[1]: z.read(n).decode() for n in names if ".dist-info/" in n}
    return {n for n in names if ".dist-info/" not in n}, info


@pytest.mark.parametrize("package", sorted(SHIPPED.values()))
def test_every_source_folder_is_a_regular_package(package):
    """setuptools ships only folders with an __init__.py: a folder without one would be silently dropped."""
    root = REPO_ROOT / package
    missing = []
    for folder in sorted({p.parent for p in root.rglob("*.py")}):
        rel = folder.relative_to(REPO_ROOT)
        if any(p in SKIP_DIRS or p.startswith(".") or p.endswith(".egg-info") for p in rel.parts[1:]):
            continue
        if not (folder / "__init__.py").is_file():
            missing.append(f"{rel}/__init__.py")
    assert not missing, "add these files, or the wheel will leave the folder's modules out:\n" + "\n".join(missing)


@pytest.mark.parametrize("dist", sorted(SHIPPED))
def test_wheel_ships_exactly_the_package_sources(wheels, dist):
    package = SHIPPED[dist]
    files, info = _wheel_files(wheels[dist])
    expected = _on_disk(package)
    missing = sorted(expected - files)
    assert not missing, f"{dist} wheel is missing (list non-.py data under package-data): {missing}"
    assert not (files - expected), f"{dist} wheel ships files it should not: {sorted(files - expected)}"
    assert info["top_level.txt"].split() == [package]


def test_versions_and_internal_pins_agree(wheels):
    metas = {}
    for dist in SHIPPED:
        _, info = _wheel_files(wheels[dist])
        metas[dist] = Parser().parsestr(info["METADATA"])
    version = metas["deepinfer-core"]["Version"]
    assert {m["Version"] for m in metas.values()} == {version}, "the four distributions must share one version"
    for dist in ("deepinfer-models", "deepinfer-nvidia", "deepinfer-ascend"):
        requires = metas[dist].get_all("Requires-Dist") or []
        assert f"deepinfer-core=={version}" in requires, f"{dist} must pin deepinfer-core=={version}: {requires}"
        assert not any(r.startswith("deepinfer-models") for r in requires), f"{dist} must not depend on models"
    core_requires = metas["deepinfer-core"].get_all("Requires-Dist")
    assert any(r.startswith("torch>=2.11") for r in core_requires), core_requires
    assert not any(r.split(";")[0].strip().startswith(("triton", "torch-npu", "torch_npu")) for r in core_requires)
    root = _pyproject(REPO_ROOT / "pyproject.toml")["project"]
    core = _pyproject(REPO_ROOT / "deepinfer_core" / "pyproject.toml")["project"]
    assert root["version"] == version
    missing = set(core["dependencies"]) - set(root["dependencies"])
    assert not missing, f"the workspace pyproject must list every deepinfer-core dependency; missing {sorted(missing)}"


def test_entry_points_are_declared(wheels):
    _, core = _wheel_files(wheels["deepinfer-core"])
    assert "deepinfer = deepinfer_core.cli:main" in core["entry_points.txt"]
    for dist, line in (("deepinfer-nvidia", "nvidia = deepinfer_nvidia:detect"),
                       ("deepinfer-ascend", "ascend = deepinfer_ascend:detect")):
        _, info = _wheel_files(wheels[dist])
        assert "[deepinfer.platforms]" in info["entry_points.txt"] and line in info["entry_points.txt"]
    root = _pyproject(REPO_ROOT / "pyproject.toml")["project"]
    assert "entry-points" not in root, "the workspace install must not register platforms (they come as wheels)"


_INSTALLED_CHECK = """
import json, os, sys
from importlib.metadata import distribution, entry_points, version
from packaging.requirements import Requirement

import deepinfer_core.platform.loader as loader
import deepinfer_models
import deepinfer_nvidia, deepinfer_ascend
from deepinfer_core.kernels.ops import register_builtin_ops
from deepinfer_core.kernels.registry import KernelRegistry

out = {"files": {m.__name__: m.__file__ for m in (loader, deepinfer_models, deepinfer_nvidia, deepinfer_ascend)}}
eps = {ep.name: ep for ep in entry_points(group="deepinfer.platforms")}
out["platform_eps"] = {n: ep.value for n, ep in eps.items()}
out["ep_loads_detect"] = eps["nvidia"].load() is deepinfer_nvidia.detect
out["detect"] = {"nvidia": deepinfer_nvidia.detect(), "ascend": deepinfer_ascend.detect()}
out["installed"] = sorted(loader.installed_platforms())
out["auto"] = type(loader.load_platform()).__name__
try:
    out["nvidia"] = type(loader.load_platform("nvidia")).__name__
except loader.PlatformNotAvailableError as exc:
    out["nvidia"] = str(exc)
import deepinfer_nvidia.platform, deepinfer_nvidia.kernels, deepinfer_nvidia.graphs
import deepinfer_ascend.platform, deepinfer_ascend.kernels
reg = KernelRegistry()
register_builtin_ops(reg)
out["registered"] = deepinfer_nvidia.kernels.register(reg) + deepinfer_ascend.kernels.register(reg)
out["vendor_modules"] = sorted(m for m in sys.modules if m.split(".")[0] in ("triton", "torch_npu"))

def unsatisfied(dist, only=None):
    bad = []
    for text in distribution(dist).requires or []:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        if only and req.name not in only:
            continue
        try:
            have = version(req.name)
        except Exception:
            bad.append(f"{text} (not installed)")
            continue
        if not req.specifier.contains(have, prereleases=True):
            bad.append(f"{text} (have {have})")
    return bad
out["unsatisfied"] = unsatisfied("deepinfer-core") + unsatisfied("deepinfer-models") + unsatisfied(
    "deepinfer-nvidia", only={"deepinfer-core"}) + unsatisfied("deepinfer-ascend", only={"deepinfer-core"})
print("@@" + json.dumps(out))
"""


def test_wheels_install_into_a_fresh_environment_and_work(wheels, tmp_path):
    env = LayeredVenv(tmp_path / "venv")
    env.install(*(wheels[d] for d in SHIPPED))
    proc = env.run(_INSTALLED_CHECK)
    out = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("@@"))[2:])
    for name, file in out["files"].items():
        assert file.startswith(str(env.site_packages)), f"{name} imported from {file}, not the installed wheel"
    assert out["platform_eps"] == {"nvidia": "deepinfer_nvidia:detect", "ascend": "deepinfer_ascend:detect"}
    assert out["ep_loads_detect"] is True
    assert out["installed"] == ["ascend", "cpu", "nvidia"]
    if torch.cuda.is_available():  # a developer's GPU machine: the plugin must find it
        assert out["detect"] == {"nvidia": "deepinfer_nvidia.platform:NvidiaPlatform", "ascend": None}
        assert out["auto"] == out["nvidia"] == "NvidiaPlatform"
    else:  # CI: no device, so nothing is detected and the cpu platform is chosen
        assert out["detect"] == {"nvidia": None, "ascend": None}
        assert out["auto"] == "CpuPlatform"
        assert "installed but unusable" in out["nvidia"]
    # every registered (op, provider) names an op of core's registry (registration is lazy)
    assert all(len(entry) == 2 for entry in out["registered"])
    assert out["vendor_modules"] == [], "detect(), the platform modules and registration must not import vendors"
    assert out["unsatisfied"] == [], f"installed requirements not met here: {out['unsatisfied']}"
    assert (env.root / "bin" / "deepinfer").is_file(), "the deepinfer console script was not installed"
