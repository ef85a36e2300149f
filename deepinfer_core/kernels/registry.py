"""The kernel registry: ops (references) and provider implementations.

Rules (ARCHITECTURE.md section 3):
- every op has a ``reference`` implementation, registered with the op;
- a second registration of the same (op, provider) is an error;
- resolution order: explicit overrides, then the platform's preferred providers,
  then ``reference``; ``DEEPINFER_KERNELS=reference`` forces references;
- callers resolve once (at model load) and keep the callable: no lookups on the hot path.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Callable, Iterable

from deepinfer_core.kernels.spec import OP_NAME_RE, PROVIDER_RE, REFERENCE, ImplSpec, OpSpec

logger = logging.getLogger(__name__)


class KernelRegistry:
    def __init__(self) -> None:
        self._ops: dict[str, OpSpec] = {}
        self._impls: dict[str, dict[str, ImplSpec]] = {}
        self._loaded: dict[tuple[str, str], Callable[..., Any]] = {}

    # -- registration -------------------------------------------------------
    def register_op(self, spec: OpSpec) -> OpSpec:
        if not OP_NAME_RE.match(spec.name):
            raise ValueError(f"op name {spec.name!r} must be 'family.name' in lowercase")
        if spec.name in self._ops:
            raise ValueError(f"op {spec.name!r} is already registered")
        self._ops[spec.name] = spec
        self._impls[spec.name] = {}
        self._loaded[(spec.name, REFERENCE)] = spec.reference
        return spec

    def register_impl(self, op: str, provider: str, target: str, supports: str | None = None,
                      batch_invariant: bool = False) -> None:
        """Register a lazy ``module:attr`` implementation of ``op`` for ``provider``.

        ``batch_invariant``: the provider promises results independent of batch size and
        composition; only such providers (and the references) run in batch-invariant mode.
        """
        if op not in self._ops:
            raise KeyError(f"cannot register provider {provider!r} for unknown op {op!r}")
        if not PROVIDER_RE.match(provider):
            raise ValueError(f"provider name {provider!r} must match {PROVIDER_RE.pattern}")
        if provider == REFERENCE:
            raise ValueError("the provider name 'reference' is reserved for the op's own reference")
        if provider in self._impls[op]:
            raise ValueError(
                f"op {op!r} already has a {provider!r} implementation "
                f"({self._impls[op][provider].target}); duplicate registration of {target!r}"
            )
        self._impls[op][provider] = ImplSpec(op, provider, target, supports, batch_invariant)

    # -- queries ------------------------------------------------------------
    def op(self, name: str) -> OpSpec:
        try:
            return self._ops[name]
        except KeyError:
            raise KeyError(f"unknown kernel op {name!r}; known ops: {sorted(self._ops)}") from None

    def ops(self) -> list[str]:
        return sorted(self._ops)

    def providers(self, op: str) -> list[str]:
        self.op(op)
        return [REFERENCE] + sorted(self._impls[op])

    def impl(self, op: str, provider: str) -> Callable[..., Any]:
        """The callable of ``provider`` for ``op`` (imports it on first use)."""
        self.op(op)
        key = (op, provider)
        if key not in self._loaded:
            if provider not in self._impls[op]:
                raise KeyError(f"op {op!r} has no provider {provider!r}; available: {self.providers(op)}")
            self._loaded[key] = self._impls[op][provider].load()
        return self._loaded[key]

    def resolve(self, op: str, preferred: Iterable[str] = (), overrides: dict[str, str] | None = None,
                batch_invariant: bool | None = None) -> tuple[str, Callable[..., Any]]:
        """Pick the provider for ``op``: override, then ``preferred`` order, then reference.

        Returns ``(provider, callable)``. Call once at load time and keep the callable.
        In batch-invariant mode (argument, else ``kernel_mode``/``DEEPINFER_BATCH_INVARIANT``)
        providers that do not declare ``batch_invariant`` are skipped with a warning, and an
        explicit override naming one is refused.
        """
        from deepinfer_core.kernels.mode import batch_invariant_enabled

        self.op(op)
        bi = batch_invariant_enabled() if batch_invariant is None else batch_invariant
        if os.environ.get("DEEPINFER_KERNELS", "").strip().lower() == REFERENCE:
            return REFERENCE, self._loaded[(op, REFERENCE)]
        if overrides and op in overrides:
            provider = overrides[op]
            if bi and provider != REFERENCE and not self._impls[op].get(provider, ImplSpec(op, provider, "")).batch_invariant:
                raise ValueError(f"kernel override {op}={provider!r} is not batch-invariant and is refused in "
                                 f"batch-invariant mode (use a batch-invariant provider or 'reference')")
            return provider, self.impl(op, provider)
        for provider in preferred:
            if provider in self._impls[op]:
                if bi and not self._impls[op][provider].batch_invariant:
                    logger.warning("batch-invariant mode: provider %r of %s is not batch-invariant; not used", provider, op)
                    continue
                return provider, self.impl(op, provider)
        return REFERENCE, self._loaded[(op, REFERENCE)]


_REGISTRY: KernelRegistry | None = None


def get_registry() -> KernelRegistry:
    """The process-wide registry with every built-in op registered."""
    global _REGISTRY
    if _REGISTRY is None:
        reg = KernelRegistry()
        from deepinfer_core.kernels.ops import register_builtin_ops

        register_builtin_ops(reg)
        _REGISTRY = reg
    return _REGISTRY
