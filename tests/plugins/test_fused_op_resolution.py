"""How the nvidia platform resolves the fused ``moe.router_topk`` (no GPU: the platform object is made without its
``__init__``, and resolution imports the kernel modules but launches nothing): in default mode it is composed from the
``triton`` router GEMV and top-k (its one-launch kernel measured even on an H100 and was removed); in
batch-invariant mode from the invariant parts (docs/determinism.md)."""
from __future__ import annotations

import pytest

pytest.importorskip("triton")

from deepinfer_core.kernels.mode import kernel_mode  # noqa: E402
from deepinfer_core.kernels.ops import register_builtin_ops  # noqa: E402
from deepinfer_core.kernels.registry import KernelRegistry  # noqa: E402
from deepinfer_core.kernels.resolve import resolve_kernels  # noqa: E402
from deepinfer_models.deepseek_v41.model import KERNEL_OPS  # noqa: E402
from deepinfer_nvidia.platform import NvidiaPlatform  # noqa: E402

NEW_OPS = ("moe.router_topk",)


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


def test_batch_invariant_mode_composes_them_from_invariant_parts(caplog, monkeypatch):
    chosen = _resolved(True, caplog, monkeypatch)
    assert all(chosen[op] == "composed" for op in NEW_OPS), {op: chosen[op] for op in NEW_OPS}
    assert chosen["gemm.dense_wide"] == "triton_bi" and chosen["moe.route_topk"] == "triton"
    assert chosen["moe.experts_mxfp4"] == "triton_bi" and chosen["moe.experts_fp8"] == "triton_bi"
