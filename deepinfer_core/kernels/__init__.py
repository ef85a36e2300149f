"""Kernel registry, op specs and pure-torch references."""
from deepinfer_core.kernels.registry import KernelRegistry, get_registry
from deepinfer_core.kernels.spec import REFERENCE, ImplSpec, OpSpec

__all__ = ["KernelRegistry", "get_registry", "OpSpec", "ImplSpec", "REFERENCE"]
