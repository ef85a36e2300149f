"""CPU-side checks of the real platform plugins (deepinfer_nvidia, deepinfer_ascend).

Their device tests live with them (deepinfer_nvidia/tests/) and need the device;
what can be checked here is detection on a machine without one, the
capability tables, and that kernel registration is wired into the registry.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import deepinfer_ascend
import deepinfer_nvidia
from deepinfer_ascend import kernels as ascend_kernels
from deepinfer_ascend.platform import AscendPlatform
from deepinfer_ascend.platform import capabilities_for as ascend_caps
from deepinfer_core.kernels.ops import register_builtin_ops
from deepinfer_core.kernels.registry import KernelRegistry
from deepinfer_core.platform import Platform, PlatformCapabilities, PlatformNotAvailableError
from deepinfer_nvidia import kernels as nvidia_kernels
from deepinfer_nvidia.platform import NvidiaPlatform
from deepinfer_nvidia.platform import capabilities_for as nvidia_caps
from tests.plugins._venvs import REPO_ROOT, clean_env

needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks behaviour on a machine without a GPU")


def _registry() -> KernelRegistry:
    reg = KernelRegistry()
    register_builtin_ops(reg)
    return reg


@pytest.mark.parametrize(
    "sm, fp8, fp4, bf16",
    [((7, 5), False, False, False), ((8, 0), False, False, True), ((8, 9), True, False, True),
     ((9, 0), True, False, True), ((10, 0), True, True, True), ((12, 0), True, True, True)],
)
def test_nvidia_capabilities_follow_the_compute_capability(sm, fp8, fp4, bf16):
    caps = nvidia_caps(*sm)
    assert isinstance(caps, PlatformCapabilities)
    assert (caps.fp8, caps.fp4, caps.bf16, caps.graph_capture) == (fp8, fp4, bf16, True)


@pytest.mark.parametrize("bad", [(0, 0), (9, -1), ("9", 0), (9.0, 0)])
def test_nvidia_capabilities_reject_nonsense(bad):
    with pytest.raises(ValueError, match="compute capability"):
        nvidia_caps(*bad)


def test_nvidia_platform_contract():
    assert issubclass(NvidiaPlatform, Platform)
    assert (NvidiaPlatform.name, NvidiaPlatform.device_type, NvidiaPlatform.dist_backend) == ("nvidia", "cuda", "nccl")
    assert NvidiaPlatform.default_providers == ("triton", "aten")
    assert deepinfer_nvidia.PLATFORM_TARGET == "deepinfer_nvidia.platform:NvidiaPlatform"


@needs_no_gpu
def test_nvidia_is_not_detected_or_constructible_without_a_gpu():
    assert deepinfer_nvidia.detect() is None
    with pytest.raises(PlatformNotAvailableError, match="CUDA device"):
        NvidiaPlatform()


@pytest.mark.parametrize(
    "name, low_precision",
    [("Ascend950PR", True), ("Ascend 950DT", True), ("Ascend910B3", False), ("Ascend910_9392", False)],
)
def test_ascend_capabilities_follow_the_chip(name, low_precision):
    caps = ascend_caps(name)
    assert (caps.fp8, caps.fp4, caps.graph_capture, caps.bf16) == (low_precision, low_precision, False, True)


def test_ascend_platform_contract():
    assert issubclass(AscendPlatform, Platform)
    assert (AscendPlatform.name, AscendPlatform.device_type, AscendPlatform.dist_backend) == ("ascend", "npu", "hccl")
    assert AscendPlatform.default_providers == ("ascendc", "torch_npu")
    with pytest.raises(ValueError, match="device_name"):
        ascend_caps("")


def test_ascend_without_torch_npu():
    if importlib.util.find_spec("torch_npu") is not None:
        pytest.skip("torch_npu is installed here")
    assert deepinfer_ascend.detect() is None
    with pytest.raises(PlatformNotAvailableError, match="torch_npu"):
        AscendPlatform()


# A stand-in for torch_npu's runtime probe: importing it registers ``torch.npu``
# exactly as the real package does, with the device count from the environment.
_STUB_TORCH_NPU = """
import os, types, torch
_count = int(os.environ.get("STUB_NPU_COUNT", "0"))
torch.npu = types.SimpleNamespace(is_available=lambda: _count > 0, device_count=lambda: _count)
"""


@pytest.mark.parametrize("count, expected", [(0, None), (2, "deepinfer_ascend.platform:AscendPlatform")])
def test_ascend_detect_asks_torch_npu(tmp_path, count, expected):
    (tmp_path / "torch_npu.py").write_text(_STUB_TORCH_NPU)
    code = "import deepinfer_ascend; print(repr(deepinfer_ascend.detect()))"
    env = clean_env(PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO_ROOT)]), STUB_NPU_COUNT=str(count))
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == repr(expected)


@pytest.mark.parametrize("plugin", [nvidia_kernels, ascend_kernels], ids=["nvidia", "ascend"])
def test_kernel_registration_is_wired(plugin, monkeypatch):
    reg = _registry()
    registered = plugin.register(reg)  # lazy: nothing vendor-specific is imported by registering
    assert all(op in reg.ops() and provider in reg.providers(op) for op, provider in registered)
    reg = _registry()
    # With an entry in the table, registration is lazy (the module does not exist and
    # is not imported) and a second registration is the registry's duplicate error.
    monkeypatch.setattr(plugin, "IMPLS", (("norm.rms", "probe", "deepinfer_no_such_module:rms_norm", None),))
    assert plugin.register(reg) == [("norm.rms", "probe")]
    assert "probe" in reg.providers("norm.rms")
    assert "deepinfer_no_such_module" not in sys.modules
    with pytest.raises(ValueError, match="already has a 'probe' implementation"):
        plugin.register(reg)


def test_platform_register_kernels_delegates_to_the_plugin_table(monkeypatch):
    monkeypatch.setattr(nvidia_kernels, "IMPLS", (("norm.rms", "triton", "deepinfer_no_such_module:f", None),))
    monkeypatch.setattr(ascend_kernels, "IMPLS", (("norm.rms", "ascendc", "deepinfer_no_such_module:g", None),))
    reg = _registry()
    # Bypass __init__ (which needs the device): register_kernels uses no device state.
    NvidiaPlatform.register_kernels(object.__new__(NvidiaPlatform), reg)
    AscendPlatform.register_kernels(object.__new__(AscendPlatform), reg)
    assert reg.providers("norm.rms") == ["reference", "ascendc", "triton"]


def test_plugin_modules_import_no_vendor_library():
    code = textwrap.dedent("""
        import sys
        import deepinfer_nvidia, deepinfer_nvidia.platform, deepinfer_nvidia.kernels, deepinfer_nvidia.graphs
        import deepinfer_ascend, deepinfer_ascend.platform, deepinfer_ascend.kernels
        deepinfer_nvidia.detect(); deepinfer_ascend.detect()
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("triton", "torch_npu", "deepinfer_models")))
    """)
    env = clean_env(PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"


def test_nvidia_default_providers_take_cublas_for_what_triton_does_not_cover(monkeypatch):
    """Resolved with the platform's default order (as the engine resolves a model's kernels), moe.experts takes
    the ``aten`` entry (grouped GEMM), not its reference's 8-row GEMM tiles, and Triton wins where it has an
    entry: gemm.dense's, whose launch hands every case but 1-4 rows of a small weight to cuBLAS
    (``aten_ops.gemm_dense``); in batch-invariant mode ``aten`` (not invariant) is never chosen."""
    monkeypatch.delenv("DEEPINFER_KERNELS", raising=False)  # the suite forces references elsewhere
    reg = KernelRegistry()
    register_builtin_ops(reg)
    nvidia_kernels.register(reg)
    order = NvidiaPlatform.default_providers
    assert reg.resolve("gemm.dense", order, batch_invariant=False)[0] == "triton"
    assert reg.resolve("moe.experts", order, batch_invariant=False)[0] == "aten"
    assert reg.resolve("moe.experts_mxfp4", order, batch_invariant=False)[0] == "triton"
    assert reg.resolve("engram.gate", order, batch_invariant=False)[0] == "triton"
    bi_order = ("triton_bi",) + order
    assert reg.resolve("gemm.dense", bi_order, batch_invariant=True)[0] == "triton_bi"
    assert reg.resolve("index.scores", bi_order, batch_invariant=True)[0] == "triton_bi"
    assert reg.resolve("index.scores", order, batch_invariant=False)[0] == "triton"
