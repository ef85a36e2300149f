"""Import boundaries (ARCHITECTURE.md section 1).

1. At run time: importing every module of ``deepinfer_core`` and
   ``deepinfer_models`` found on disk, in a fresh interpreter, loads no vendor
   module and no platform plugin.
2. Statically: no ``import`` statement (lazy ones inside functions included)
   crosses a forbidden edge of the package graph:
   core -> {models, plugins, vendors}; models -> {plugins, vendors};
   plugin -> {models, the other plugin}.
"""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.boundaries._tree import REPO_ROOT, module_names, source_files

VENDOR_ROOTS = ("triton", "torch_npu", "flash_mla", "deep_gemm", "vllm", "sglang")
PLUGIN_ROOTS = ("deepinfer_nvidia", "deepinfer_ascend")

# Top-level modules each package must never import.
FORBIDDEN_EDGES: dict[str, tuple[str, ...]] = {
    "deepinfer_core": ("deepinfer_models",) + PLUGIN_ROOTS + VENDOR_ROOTS,
    "deepinfer_models": PLUGIN_ROOTS + VENDOR_ROOTS,
    "deepinfer_nvidia": ("deepinfer_models", "deepinfer_ascend"),
    "deepinfer_ascend": ("deepinfer_models", "deepinfer_nvidia"),
}

_MARK = "@@DEEPINFER-IMPORT-REPORT@@"
_IMPORT_ALL = f"""
import importlib, json, sys
errors = {{}}
files = {{}}
for name in json.loads(sys.argv[1]):
    try:
        mod = importlib.import_module(name)
        files[name] = getattr(mod, "__file__", None) or list(getattr(mod, "__path__", []))
    except BaseException as exc:  # report every failure, not just the first
        errors[name] = f"{{type(exc).__name__}}: {{exc}}"
print({_MARK!r} + json.dumps({{"errors": errors, "files": files, "modules": sorted(sys.modules)}}))
"""


def _import_in_fresh_interpreter(names: list[str]) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(REPO_ROOT)
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORT_ALL, json.dumps(names)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, f"import subprocess failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith(_MARK)), None)
    assert line is not None, f"no report from the import subprocess:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(line[len(_MARK):])


def test_importing_core_and_models_loads_no_vendor_or_plugin_module():
    names = module_names("deepinfer_core") + module_names("deepinfer_models")
    report = _import_in_fresh_interpreter(names)
    assert not report["errors"], "modules that fail to import on the CPU:\n" + "\n".join(
        f"  {n}: {e}" for n, e in sorted(report["errors"].items())
    )
    # The repository's copies were imported, not an installed wheel.
    for name, where in report["files"].items():
        paths = where if isinstance(where, list) else [where]
        assert any(Path(p).resolve().is_relative_to(REPO_ROOT) for p in paths), f"{name} imported from {where}"
    loaded = [m for m in report["modules"] if m.split(".")[0] in VENDOR_ROOTS + PLUGIN_ROOTS]
    assert not loaded, f"importing deepinfer_core + deepinfer_models loaded forbidden modules: {loaded}"
    assert len(report["files"]) == len(names)


def _imported_roots(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, top-level module) for every import statement and literal dynamic import."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name.split(".")[0]) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module.split(".")[0]))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            fn = node.func
            fname = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
            if fname in ("import_module", "__import__", "find_spec") and isinstance(node.args[0].value, str):
                found.append((node.lineno, node.args[0].value.split(".")[0].split(":")[0]))
    return found


def forbidden_imports(package: str) -> list[str]:
    """``file:line: imports X`` for every forbidden edge out of ``package``."""
    banned = FORBIDDEN_EDGES[package]
    bad = []
    for path in source_files(package):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for line, root in _imported_roots(tree):
            if root in banned:
                bad.append(f"{path.relative_to(REPO_ROOT)}:{line}: imports {root}")
    return bad


@pytest.mark.parametrize("package", sorted(FORBIDDEN_EDGES))
def test_no_forbidden_import_edges(package):
    if not (REPO_ROOT / package).is_dir():
        pytest.fail(f"package directory {package}/ is missing")
    bad = forbidden_imports(package)
    assert not bad, f"{package} crosses the package boundary:\n" + "\n".join(bad)


def test_import_scanner_sees_lazy_and_dynamic_imports():
    src = (
        "import os\n"
        "def f():\n"
        "    import triton.language as tl\n"
        "    from deep_gemm import x\n"
        "    importlib.import_module('torch_npu')\n"
        "    __import__('vllm.engine')\n"
        "from . import sibling\n"
    )
    roots = sorted(r for _, r in _imported_roots(ast.parse(src)))
    assert roots == ["deep_gemm", "os", "torch_npu", "triton", "vllm"]  # relative imports are in-package
