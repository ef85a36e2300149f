"""The ``nvidia`` platform: CUDA device handles, memory, capabilities, NCCL, CUDA graphs.

Core reaches this class only through the string that :func:`deepinfer_nvidia.detect`
returns; nothing in core or models imports it. Capabilities are read from the
device once, at construction, so core can branch on ``caps.fp8`` / ``caps.fp4``
instead of on compute capabilities.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

import torch

from deepinfer_core.platform.interface import Platform, PlatformCapabilities
from deepinfer_core.platform.loader import PlatformNotAvailableError

logger = logging.getLogger(__name__)


def capabilities_for(major: int, minor: int) -> PlatformCapabilities:
    """Capabilities of a GPU with compute capability ``major.minor``.

    - bf16 tensor cores from SM80 (Ampere);
    - fp8 (e4m3/e5m2) tensor cores from SM89 (Ada) and SM90 (Hopper);
    - fp4 (MXFP4/NVFP4) tensor cores from SM100 (Blackwell);
    - CUDA graphs on every GPU torch supports.
    """
    if not (isinstance(major, int) and isinstance(minor, int)) or major < 1 or minor < 0:
        raise ValueError(f"compute capability must be two non-negative ints with major >= 1, got {major!r}.{minor!r}")
    sm = (major, minor)
    return PlatformCapabilities(
        fp8=sm >= (8, 9),
        fp4=sm >= (10, 0),
        graph_capture=True,
        bf16=sm >= (8, 0),
    )


class _ProvidersByMode:
    """``default_providers`` that follow the kernel mode at resolution time.

    Default mode: ``default``. Batch-invariant mode (``kernel_mode(batch_invariant=True)`` or
    ``DEEPINFER_BATCH_INVARIANT=1`` while a model resolves its kernels): ``invariant + default``,
    so an op's batch-invariant launch (``triton_bi``) is taken before the registry would skip the
    non-invariant ``triton`` one, and ops whose ``triton`` kernel is itself invariant still get it.
    The ``triton_bi`` launches never run in default mode, where the faster row-count-dependent
    tiles, cuBLAS and grouped GEMMs are free to differ in the last bits. Read on the class it is the
    default order (what the platform contract states). An instance's vendor providers (``vendors``: FlashMLA,
    DeepGEMM where they import, ``kernels.vendors``) go first in default mode; none is batch-invariant.
    """

    def __init__(self, default: tuple[str, ...], invariant: tuple[str, ...]) -> None:
        self.default, self.invariant = default, invariant

    def __get__(self, obj: Any, owner: Any = None) -> tuple[str, ...]:
        if obj is None:
            return self.default
        from deepinfer_core.kernels.mode import batch_invariant_enabled

        if batch_invariant_enabled():
            return self.invariant + self.default
        return tuple(getattr(obj, "vendors", ())) + self.default


class NvidiaPlatform(Platform):
    """One process's view of its NVIDIA GPU (the current CUDA device).

    In a multi-GPU run each rank sets its current device before the platform is
    built (``torch.cuda.set_device(local_rank)``); capabilities and memory are
    those of that device.
    """

    name = "nvidia"
    device_type = "cuda"
    dist_backend = "nccl"
    # Tried in this order before the op's reference (see KernelRegistry.resolve); in batch-invariant
    # mode "triton_bi" first (see _ProvidersByMode). "aten" (cuBLAS, grouped GEMMs through torch) serves
    # the ops Triton does not: without it gemm.dense and moe.experts ran their references (8-row GEMM tiles).
    default_providers = _ProvidersByMode(("triton", "aten"), ("triton_bi",))
    # kernels resolved with / without wrap_kernel's compile wrapper (class defaults: instances made without
    # __init__, as the CPU plugin tests do, count from zero too)
    _kernels_opaque = 0
    _kernels_plain = 0

    def __init__(self) -> None:
        if not torch.cuda.is_available():
            raise PlatformNotAvailableError("the nvidia platform needs a CUDA device, and torch sees none")
        self.index = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(self.index)
        self.device_name: str = props.name
        self.compute_capability: tuple[int, int] = (props.major, props.minor)
        # An instance attribute shadows the conservative class default.
        self.capabilities = capabilities_for(props.major, props.minor)
        from deepinfer_nvidia.kernels.vendors import vendor_providers

        # FlashMLA / DeepGEMM providers tried before Triton, where they import and fit this GPU (none on SM90
        # by default; nothing imports them here)
        self.vendors: tuple[str, ...] = vendor_providers(self.compute_capability)
        self._kernels_opaque = self._kernels_plain = 0  # kernels resolved with / without wrap_kernel's wrapper

    def total_memory_bytes(self) -> int:
        """Total memory of the current device in bytes (``cudaMemGetInfo``'s total)."""
        _free, total = torch.cuda.mem_get_info(self.index)
        return int(total)

    def synchronize(self) -> None:
        """Block until all queued work on the current device has finished."""
        torch.cuda.synchronize(self.index)

    def register_kernels(self, registry: Any) -> None:
        """Register the Triton, aten, FlashMLA and DeepGEMM implementations, lazily (nothing imported)."""
        from deepinfer_nvidia.kernels import register

        done = register(registry)
        logger.info("nvidia: registered %d kernel implementations", len(done))

    def wrap_kernel(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """With ``DEEPINFER_NV_COMPILE=1`` (``graphs.compile_enabled``) every resolved kernel is opaque to
        ``torch.compile``: it runs as it is, and only the model's glue between kernel calls is fused."""
        from deepinfer_nvidia.graphs import compile_enabled, opaque_kernel

        if compile_enabled():
            self._kernels_opaque += 1
            return opaque_kernel(fn)
        self._kernels_plain += 1
        return fn

    def compiles_steps(self) -> bool:
        """Compile graphed steps only when every kernel resolved through this platform is opaque: a kernel
        resolved while compiling was off (batch-invariant mode is entered around model loading, not around
        graph capture) would be traced by dynamo, and inductor cannot compile the Triton launchers (H200,
        pass28e: ``NameError: _ue8m0``; the capture then failed and the steps ran eagerly)."""
        from deepinfer_nvidia.graphs import compile_enabled

        return compile_enabled() and self._kernels_opaque > 0 and self._kernels_plain == 0

    def graph_runner(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Wrap ``fn`` so each new input signature is captured once as a CUDA graph and replayed."""
        from deepinfer_nvidia.graphs import CudaGraphRunner

        return CudaGraphRunner(fn, compile=self.compiles_steps())

    def __repr__(self) -> str:
        major, minor = self.compute_capability
        return f"NvidiaPlatform(device={self.device_name!r}, cuda:{self.index}, sm{major}{minor})"
