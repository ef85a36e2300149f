"""Kernel registry rules: reference-first ops, lazy impls, duplicates, resolution order."""
from __future__ import annotations

import pytest
import torch

from deepinfer_core.kernels.registry import KernelRegistry, get_registry
from deepinfer_core.kernels.spec import OpSpec
from deepinfer_core.testing.conformance import check_impl


def _reg():
    r = KernelRegistry()
    r.register_op(OpSpec("norm.twice", lambda x: 2 * x, lambda dt, dev, s: iter([((torch.ones(3, dtype=dt),), {})])))
    return r


def test_duplicate_op_and_impl_raise():
    r = _reg()
    with pytest.raises(ValueError, match="already registered"):
        r.register_op(OpSpec("norm.twice", lambda x: x))
    r.register_impl("norm.twice", "fast", "operator:mul")
    with pytest.raises(ValueError, match="already has a 'fast' implementation"):
        r.register_impl("norm.twice", "fast", "operator:add")
    with pytest.raises(ValueError, match="reserved"):
        r.register_impl("norm.twice", "reference", "operator:add")
    with pytest.raises(KeyError, match="unknown op"):
        r.register_impl("norm.nope", "fast", "operator:add")


def test_impl_is_lazy_and_resolution_order(monkeypatch):
    r = _reg()
    r.register_impl("norm.twice", "ghost", "no_such_module_xyz:fn")  # not imported until chosen
    monkeypatch.delenv("DEEPINFER_KERNELS", raising=False)
    assert r.resolve("norm.twice")[0] == "reference"
    r.register_impl("norm.twice", "alt", "tests.core.test_registry:_double")
    assert r.resolve("norm.twice", preferred=("alt",))[0] == "alt"
    assert r.resolve("norm.twice", preferred=("missing", "alt"))[0] == "alt"
    with pytest.raises(ModuleNotFoundError):
        r.resolve("norm.twice", preferred=("ghost",))
    monkeypatch.setenv("DEEPINFER_KERNELS", "reference")
    assert r.resolve("norm.twice", preferred=("alt",))[0] == "reference"


def _double(x):
    return x + x


def test_conformance_harness_catches_a_wrong_impl():
    r = _reg()
    r.register_impl("norm.twice", "good", "tests.core.test_registry:_double")
    r.register_impl("norm.twice", "bad", "torch:neg")
    assert check_impl("norm.twice", "good", registry=r) > 0
    with pytest.raises(AssertionError):
        check_impl("norm.twice", "bad", registry=r)


def test_builtin_ops_all_registered_with_references():
    reg = get_registry()
    for op in ("norm.rms", "rope.interleaved", "attention.sparse_sink", "compress.softmax_pool", "index.scores",
               "index.topk", "mhc.mix", "moe.route_topk", "moe.experts", "gemm.fp8_block", "gemm.mxfp4"):
        assert reg.providers(op)[0] == "reference"


def test_reference_passes_its_own_conformance():
    # The harness itself must accept the reference on every generated case.
    reg = get_registry()
    for op in reg.ops():
        if reg.op(op).input_gen is not None:
            assert check_impl(op, "reference", dtypes=(torch.float32,), seeds=(0,)) > 0


def test_batch_invariant_mode_skips_and_refuses_non_invariant_providers(monkeypatch, caplog):
    from deepinfer_core.kernels.mode import kernel_mode

    monkeypatch.delenv("DEEPINFER_KERNELS", raising=False)
    r = _reg()
    r.register_impl("norm.twice", "fast", "tests.core.test_registry:_double")
    r.register_impl("norm.twice", "stable", "tests.core.test_registry:_double", batch_invariant=True)
    assert r.resolve("norm.twice", preferred=("fast", "stable"))[0] == "fast"
    with kernel_mode(batch_invariant=True):
        assert r.resolve("norm.twice", preferred=("fast", "stable"))[0] == "stable"
        assert "not batch-invariant" in caplog.text
        assert r.resolve("norm.twice", preferred=("fast",))[0] == "reference"
        with pytest.raises(ValueError, match="refused in batch-invariant mode"):
            r.resolve("norm.twice", overrides={"norm.twice": "fast"})
    monkeypatch.setenv("DEEPINFER_BATCH_INVARIANT", "1")
    assert r.resolve("norm.twice", preferred=("fast", "stable"))[0] == "stable"


def _add_three(x):
    return x + 3


class _Platform:
    """What resolve_kernels asks of a platform: a name, its providers, a registration hook, a kernel wrapper."""

    name = "test_fused"
    default_providers = ("alt",)

    def register_kernels(self, registry):
        pass

    def wrap_kernel(self, fn):
        return fn


def test_fused_op_runs_as_the_platforms_parts_unless_a_provider_fuses_it(monkeypatch):
    from deepinfer_core.kernels.resolve import resolve_kernels

    def compose(k):
        return lambda x: k["norm.plus_one"](k["norm.twice"](x))

    r = KernelRegistry()
    r.register_op(OpSpec("norm.twice", lambda x: 2 * x))
    r.register_op(OpSpec("norm.plus_one", lambda x: x + 1))
    parts = ("norm.twice", "norm.plus_one")
    r.register_op(OpSpec("norm.fused", compose({"norm.twice": lambda x: 2 * x, "norm.plus_one": lambda x: x + 1}),
                         components=parts, compose=compose))
    r.register_impl("norm.plus_one", "alt", "tests.core.test_registry:_add_three")  # the platform's part
    monkeypatch.delenv("DEEPINFER_KERNELS", raising=False)
    x = torch.tensor([1.0, 2.0])
    table = resolve_kernels(["norm.fused"], _Platform(), registry=r)
    assert set(table) == {"norm.fused", *parts}  # the parts are resolved with it
    assert torch.equal(table["norm.fused"](x), 2 * x + 3)  # built from the platform's plus_one, not the reference's
    monkeypatch.setenv("DEEPINFER_KERNELS", "reference")
    assert torch.equal(resolve_kernels(["norm.fused"], _Platform(), registry=r)["norm.fused"](x), 2 * x + 1)
    monkeypatch.delenv("DEEPINFER_KERNELS")
    r.register_impl("norm.fused", "alt", "tests.core.test_registry:_double")  # a provider's own fused kernel
    assert torch.equal(resolve_kernels(["norm.fused"], _Platform(), registry=r)["norm.fused"](x), 2 * x)
