"""No file in deepinfer_core/ or deepinfer_models/ names a device (STYLE.md habit 7).

Device knowledge lives in platforms: ``deepinfer_core/platform/`` (the only
exempt folder) and the plugins. Everything else branches on
``platform.capabilities`` and uses ``platform.device(...)``.

The scan walks each file's AST and splits every identifier, attribute, import
name and string literal into words (on ``_``, ``.``, punctuation and camelCase),
so ``torch.cuda``, ``x.is_cuda``, ``import torch_npu``, ``"cuda:0"``,
``CudaGraph`` and ``use_npu`` are all caught while ``gpu_memory_utilization``,
``relationship`` or ``timestamps`` are not. Docstrings and comments are prose,
not branches, and are not scanned.
"""
from __future__ import annotations

import ast
import re

from tests.boundaries._tree import REPO_ROOT, source_files

DEVICE_WORDS = frozenset({"cuda", "npu", "xpu", "mps", "hip", "rocm"})
EXEMPT = (REPO_ROOT / "deepinfer_core" / "platform",)

_WORD = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")


def words(text: str) -> set[str]:
    """Lower-case words of an identifier or string: 'is_cuda' -> {'is', 'cuda'}, 'CUDAGraph' -> {'cuda', 'graph'}."""
    return {w.lower() for w in _WORD.findall(text)}


def _docstring_nodes(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = getattr(node, "body", [])
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                if isinstance(body[0].value.value, str):
                    ids.add(id(body[0].value))
    return ids


def _names_in(node: ast.AST) -> list[tuple[str, str]]:
    """(kind, text) pairs a node contributes: identifiers, attributes, imports, strings."""
    if isinstance(node, ast.Name):
        return [("name", node.id)]
    if isinstance(node, ast.Attribute):
        return [("attribute", node.attr)]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [("definition", node.name)]
    if isinstance(node, ast.arg):
        return [("argument", node.arg)]
    if isinstance(node, ast.keyword) and node.arg:
        return [("keyword", node.arg)]
    if isinstance(node, ast.alias):
        return [("import", node.name)] + ([("import", node.asname)] if node.asname else [])
    if isinstance(node, ast.ImportFrom) and node.module:
        return [("import", node.module)]
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [("string", node.value)]
    return []


def scan_source(source: str, filename: str = "<string>") -> list[tuple[int, str, str]]:
    """(line, kind, text) for every device name in ``source`` outside docstrings."""
    tree = ast.parse(source, filename=filename)
    docstrings = _docstring_nodes(tree)
    hits = []
    for node in ast.walk(tree):
        if id(node) in docstrings:
            continue
        for kind, text in _names_in(node):
            if words(text) & DEVICE_WORDS:
                line = getattr(node, "lineno", None)
                hits.append((line if line is not None else 0, kind, text))
    return sorted(hits)


def device_names_in_tree() -> list[str]:
    report = []
    for package in ("deepinfer_core", "deepinfer_models"):
        for path in source_files(package):
            if any(path.is_relative_to(e) for e in EXEMPT):
                continue
            rel = path.relative_to(REPO_ROOT)
            for line, kind, text in scan_source(path.read_text(encoding="utf-8"), str(rel)):
                shown = text if len(text) <= 60 else text[:57] + "..."
                report.append(f"{rel}:{line}: {kind} {shown!r}")
    return report


def test_core_and_models_name_no_device():
    hits = device_names_in_tree()
    assert not hits, (
        "device names outside deepinfer_core/platform/ (use platform.device()/capabilities, "
        "or move the code into a platform plugin):\n" + "\n".join(hits)
    )


def test_scanner_catches_every_form():
    src = '''
import torch_npu
from torch.cuda import graphs
import torch.backends.mps as m
def f(x, use_npu=False):
    torch.cuda.synchronize()
    if x.is_cuda or x.device.type == "npu":
        return x.to("cuda:0")
    y = torch.xpu
    z = torch.version.hip
    g = CUDAGraph()
    w = f"{x}-rocm"
    return dict(cuda_graph=True)
'''
    kinds_texts = {(k, t) for _, k, t in scan_source(src)}
    expected = {
        ("import", "torch_npu"), ("import", "torch.cuda"), ("import", "torch.backends.mps"),
        ("argument", "use_npu"), ("attribute", "cuda"), ("attribute", "is_cuda"), ("string", "npu"),
        ("string", "cuda:0"), ("attribute", "xpu"), ("attribute", "hip"), ("name", "CUDAGraph"),
        ("string", "-rocm"), ("keyword", "cuda_graph"),
    }
    assert expected <= kinds_texts, f"missed: {expected - kinds_texts}"


def test_scanner_ignores_prose_and_lookalikes():
    src = '''
"""Runs on CUDA or an NPU through the platform; see deepinfer_core/platform."""
# torch.cuda is only named in comments here
class Engine:
    """Graph capture on cuda is the platform's job."""
    def step(self, gpu_memory_utilization: float, relationship, timestamps, chip="hipster"):
        """x.is_cuda is never checked."""
        device = self.platform.device(0)
        return "cpu", device, "npus are plural here"
'''
    assert scan_source(src) == []


def test_words_splitting():
    assert words("is_cuda") == {"is", "cuda"}
    assert words("CUDAGraphRunner") == {"cuda", "graph", "runner"}
    assert words("cuda:0") == {"cuda", "0"}
    assert "cuda" not in words("barracudas") and "mps" not in words("timestamps")
