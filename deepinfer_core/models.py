"""Find model loaders without importing model packages statically.

Model packages register through the entry-point group ``deepinfer.models`` (the
value names a module with ``MODEL_REGISTRY``, optional ``CHAT_ENCODING`` and
``register_embedded()``). From a source tree, where entry points may not be
installed, ``deepinfer_models.registry`` is tried by name.
"""
from __future__ import annotations

import importlib
import importlib.util
import json
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType

from deepinfer_core.kernels.spec import _load_target

MODEL_GROUP = "deepinfer.models"
_FALLBACK = "deepinfer_models.registry"


def model_registries() -> list[ModuleType]:
    mods: list[ModuleType] = []
    for ep in entry_points(group=MODEL_GROUP):
        mods.append(importlib.import_module(ep.value.split(":")[0]))
    if not mods and importlib.util.find_spec(_FALLBACK.split(".")[0]) is not None:
        mods.append(importlib.import_module(_FALLBACK))
    return mods


def register_embedded_models() -> None:
    for mod in model_registries():
        fn = getattr(mod, "register_embedded", None)
        if fn is not None:
            fn()


def read_architecture(model_dir: Path) -> str:
    raw = json.loads((Path(model_dir) / "config.json").read_text())
    archs = raw.get("architectures") or []
    if not archs:
        raise ValueError(f"{model_dir}/config.json has no 'architectures' entry")
    return archs[0]


def model_loader(arch: str):
    known: dict[str, str] = {}
    for mod in model_registries():
        known.update(getattr(mod, "MODEL_REGISTRY", {}))
    if arch not in known:
        raise ValueError(f"architecture {arch!r} is not supported; supported: {sorted(known) or 'none (install deepinfer-models)'}")
    return _load_target(known[arch])


def chat_encoding(arch: str) -> str:
    for mod in model_registries():
        enc = getattr(mod, "CHAT_ENCODING", {}).get(arch)
        if enc:
            return enc
    return "v41"
