"""How the nvidia platform resolves the fused ``moe.router_topk`` and ``moe.topk_experts_mxfp4`` (no GPU: the
platform object is made without its ``__init__``, and resolution imports the kernel modules but launches nothing): in
default mode the router is composed from the ``triton`` router GEMV and top-k (its one-launch kernel measured even on
an H100 and was removed) and the routed-experts op is ``triton_route_align``'s; in batch-invariant mode both are
composed from the invariant parts (docs/determinism.md), the second from the first (a fused op made of a fused op)."""
from __future__ import annotations

import pytest

pytest.importorskip("triton")

from deepinfer_core.kernels.mode import kernel_mode  # noqa: E402
from deepinfer_core.kernels.ops import register_builtin_ops  # noqa: E402
from deepinfer_core.kernels.registry import KernelRegistry  # noqa: E402
from deepinfer_core.kernels.resolve import resolve_kernels  # noqa: E402
from deepinfer_models.deepseek_v41.model import KERNEL_OPS  # noqa: E402
from deepinfer_nvidia.platform import NvidiaPlatform  # noqa: E402

NEW_OPS = ("moe.router_topk", "moe.topk_experts_mxfp4")


def _resolved(batch_invariant: bool, caplog, monkeypatch) -> dict[str, str]:
    monkeypatch.delenv("DEEPINFER_KERNELS", raising=False)  # the suite forces the references elsewhere
    reg = KernelRegistry()
    register_builtin_ops(reg)
    platform = object.__new__(NvidiaPlatform)  # register_kernels and default_providers use no device state
    caplog.clear()
    with caplog.at_level("INFO", logger="deepinfer_core.kernels.resolve"), kernel_mode(batch_invariant):
        table = resolve_kernels(KERNEL_OPS, platform, registry=reg)
    assert set(NEW_OPS) <= set(table) and all(callable(table[op]) for op in NEW_OPS)
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("kernels: "))
    return dict(kv.split("=", 1) for kv in line[len("kernels: "):].split(", "))


def test_default_mode_composes_it_from_the_triton_parts(caplog, monkeypatch):
    chosen = _resolved(False, caplog, monkeypatch)
    assert chosen["moe.router_topk"] == "composed"
    assert chosen["gemm.dense_wide"] == "triton" and chosen["moe.route_topk"] == "triton"
    assert chosen["moe.topk_experts_mxfp4"] == "triton"


def test_batch_invariant_mode_composes_them_from_invariant_parts(caplog, monkeypatch):
    chosen = _resolved(True, caplog, monkeypatch)
    assert all(chosen[op] == "composed" for op in NEW_OPS), {op: chosen[op] for op in NEW_OPS}
    assert chosen["gemm.dense_wide"] == "triton_bi" and chosen["moe.route_topk"] == "triton"
    assert chosen["moe.experts_mxfp4"] == "triton_bi" and chosen["moe.experts_fp8"] == "triton_bi"


def test_a_fused_op_of_fused_ops_composes_after_its_parts_on_any_platform():
    """No platform: the routed-experts op is composed from the composed router and the experts' reference, and it
    gives the reference's numbers (whatever the names' sort order puts first)."""
    import torch

    from deepinfer_core.kernels.registry import get_registry

    reg = KernelRegistry()
    register_builtin_ops(reg)
    table = resolve_kernels(["moe.topk_experts_mxfp4"], None, registry=reg)
    assert {"moe.router_topk", "gemm.dense_wide", "moe.route_topk", "moe.experts_mxfp4"} <= set(table)
    spec = get_registry().op("moe.topk_experts_mxfp4")
    for args, kwargs in spec.input_gen(torch.float32, "cpu", 0):
        assert torch.equal(table["moe.topk_experts_mxfp4"](*args, **kwargs), spec.reference(*args, **kwargs))


def test_a_cycle_of_fused_ops_is_named():
    from deepinfer_core.kernels.spec import OpSpec

    reg = KernelRegistry()
    reg.register_op(OpSpec("t.a", lambda x: x, components=("t.b",), compose=lambda k: k["t.b"]))
    reg.register_op(OpSpec("t.b", lambda x: x, components=("t.a",), compose=lambda k: k["t.a"]))
    with pytest.raises(ValueError, match="cycle"):
        resolve_kernels(["t.a"], None, registry=reg)
