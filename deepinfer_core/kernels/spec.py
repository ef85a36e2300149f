"""Kernel op and implementation specifications.

An op (``family.name``) is defined by its pure-torch reference. Providers add
implementations that are checked against that reference by the shared
conformance harness (``deepinfer_core.testing.conformance``).
"""
from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

OP_NAME_RE = re.compile(r"^[a-z_][a-z0-9_]*\.[a-z_][a-z0-9_]*$")
PROVIDER_RE = re.compile(r"^[a-z_][a-z0-9_]*$")
REFERENCE = "reference"

# Default tolerances (atol, rtol) by dtype for conformance checks.
DEFAULT_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-10, 1e-10),
    torch.float32: (1e-4, 1e-4),
    torch.bfloat16: (2e-2, 2e-2),
    torch.float16: (2e-3, 2e-3),
}


@dataclass(frozen=True)
class OpSpec:
    """One op: its reference (the definition), an input generator and tolerances.

    ``input_gen(dtype, device, seed)`` yields ``(args, kwargs)`` tuples covering
    representative shapes; ``tolerances`` overrides ``DEFAULT_TOLERANCES``.
    ``compare`` (optional) replaces allclose for ops whose outputs are sets
    (e.g. top-k indices in unspecified order).

    A fused op names the ops it is made of (``components``) and ``compose(kernels) -> callable``, which
    builds it from those ops' callables (``{op: callable}``); its reference is ``compose`` over the
    components' references. Where no provider implements the fused op, ``resolve_kernels`` builds it from
    the components as they resolve on the platform, so a model may call the fused op everywhere and loses
    nothing on a platform that only has the parts.
    """

    name: str
    reference: Callable[..., Any]
    input_gen: Callable[..., Any] | None = None
    tolerances: dict = field(default_factory=dict)
    compare: Callable[[Any, Any, torch.dtype], None] | None = None
    doc: str = ""
    components: tuple[str, ...] = ()
    compose: Callable[[dict], Callable[..., Any]] | None = None

    def tolerance(self, dtype: torch.dtype) -> tuple[float, float]:
        return self.tolerances.get(dtype, DEFAULT_TOLERANCES.get(dtype, (1e-4, 1e-4)))


@dataclass(frozen=True)
class ImplSpec:
    """A provider's implementation of an op, loaded lazily from ``target``.

    ``target`` is ``"module:attr"``; nothing is imported until ``load()``.
    ``supports(*args, **kwargs) -> bool`` (also a lazy target, optional) answers
    only "does this kernel cover these operands"; contract violations raise.
    """

    op: str
    provider: str
    target: str
    supports: str | None = None
    # True when the kernel's reduction order never depends on how many tokens share the
    # step or where a token sits in it (see docs/determinism.md).
    batch_invariant: bool = False

    def load(self) -> Callable[..., Any]:
        return _load_target(self.target)

    def load_supports(self) -> Callable[..., bool] | None:
        return _load_target(self.supports) if self.supports else None


def _load_target(target: str) -> Any:
    if ":" not in target:
        raise ValueError(f"kernel target {target!r} must look like 'module:attr'")
    module_name, attr = target.split(":", 1)
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def acc(x: torch.Tensor) -> torch.Tensor:
    """Accumulation precision of the references: fp32, or fp64 when given fp64 (textbook tests)."""
    return x if x.dtype == torch.float64 else x.float()
