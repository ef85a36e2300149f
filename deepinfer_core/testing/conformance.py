"""Shared conformance harness: check a provider's implementation against the op's reference.

Plugins call ``check_impl(op, provider, device)`` (or ``check_all(provider, device)``)
from their own device tests; the harness generates fresh inputs per case, poisons
any preallocated output (not applicable to functional ops) and compares with the
op's tolerances, or its custom ``compare`` for set-valued outputs.
"""
from __future__ import annotations

from typing import Any

import torch

from deepinfer_core.kernels.registry import KernelRegistry, get_registry


def _to(obj: Any, device) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to(o, device) for o in obj)
    return obj


def _compare(out: Any, ref: Any, atol: float, rtol: float, where: str) -> None:
    if isinstance(ref, torch.Tensor):
        assert isinstance(out, torch.Tensor), f"{where}: expected a tensor, got {type(out)}"
        assert out.shape == ref.shape, f"{where}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
        assert out.dtype == ref.dtype, f"{where}: dtype {out.dtype} != reference {ref.dtype}"
        if ref.is_floating_point():
            torch.testing.assert_close(out.float().cpu(), ref.float().cpu(), atol=atol, rtol=rtol, msg=lambda m: f"{where}: {m}")
        else:
            assert torch.equal(out.cpu(), ref.cpu()), f"{where}: integer outputs differ"
    elif isinstance(ref, (tuple, list)):
        assert len(out) == len(ref), f"{where}: {len(out)} outputs != {len(ref)}"
        for i, (o, r) in enumerate(zip(out, ref)):
            _compare(o, r, atol, rtol, f"{where}[{i}]")
    else:
        assert out == ref, f"{where}: {out!r} != {ref!r}"


def check_impl(op: str, provider: str, device: str | torch.device = "cpu",
               dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16), seeds: tuple[int, ...] = (0, 1),
               registry: KernelRegistry | None = None) -> int:
    """Run ``provider``'s ``op`` against the reference on generated inputs. Returns the number of cases checked."""
    reg = registry or get_registry()
    spec = reg.op(op)
    if spec.input_gen is None:
        raise ValueError(f"op {op!r} has no input generator; conformance cannot check it")
    impl = reg.impl(op, provider)
    cases = 0
    for dtype in dtypes:
        atol, rtol = spec.tolerance(dtype)
        for seed in seeds:
            for i, (args, kwargs) in enumerate(spec.input_gen(dtype, device, seed)):
                ref = spec.reference(*_to(args, "cpu"), **kwargs)
                out = impl(*args, **kwargs)
                where = f"{op}[{provider}] dtype={dtype} seed={seed} case={i}"
                if spec.compare is not None:
                    spec.compare(_to(out, "cpu"), ref, dtype)
                else:
                    _compare(_to(out, "cpu"), ref, atol, rtol, where)
                cases += 1
    return cases


def check_all(provider: str, device: str | torch.device, registry: KernelRegistry | None = None, **kw) -> dict[str, int]:
    """Check every op that ``provider`` implements. Returns op -> cases checked."""
    reg = registry or get_registry()
    return {op: check_impl(op, provider, device, registry=reg, **kw) for op in reg.ops() if provider in reg.providers(op)}
