"""Which vendor kernel libraries (FlashMLA, DeepGEMM) the platform offers as providers, and where.

Their adapters (``flashmla.py``, ``deepgemm.py``) are registered always (metadata only, nothing imported); this
module decides whether the platform tries them before Triton:
- ``flashmla`` when ``flash_mla`` imports and the device is SM100. Its sparse attention reads the same bf16
  operands as the op's definition, so it is on by default there (``DEEPINFER_NV_FLASHMLA=0`` turns it off;
  ``=1`` also takes it on SM90, which FlashMLA's sparse prefill supports).
- ``deepgemm`` when ``deep_gemm`` imports, the device is SM100 and ``DEEPINFER_NV_DEEPGEMM=1``: its GEMMs take FP8
  activations (quantised per token and 128 columns, as DeepSeek's inference code, vLLM and SGLang run V4), so
  its outputs differ from the op's bf16-activation definition by that rounding; opt-in for that reason.
Neither library is installed on any machine of this project: nothing here has run against them
(``docs/vendor_kernels.md``).
"""
from __future__ import annotations

import functools
import importlib.util
import os

import torch


@functools.lru_cache(maxsize=None)
def importable(module: str) -> bool:
    """Whether ``module`` can be imported (found on the path; not imported here)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def arch_of(device: torch.device) -> tuple[int, int]:
    """Compute capability of a CUDA device."""
    return torch.cuda.get_device_capability(device)


def _knob(name: str) -> str:
    """``""`` (unset), ``"0"`` or ``"1"``; anything else is refused with the variable's name (a typo such as
    ``yes`` must not silently mean "off")."""
    value = os.environ.get(name, "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"{name} must be 0 or 1 (or unset), got {value!r}")
    return value


def vendor_providers(capability: tuple[int, int], has=importable) -> tuple[str, ...]:
    """Vendor providers to try before ``triton`` on a device of this compute capability, best first.

    ``has(module)`` answers whether a library imports (a parameter so the rule is testable without them)."""
    major = capability[0]
    out = []
    flashmla = _knob("DEEPINFER_NV_FLASHMLA")
    if flashmla != "0" and has("flash_mla") and (major == 10 or (flashmla == "1" and major == 9)):
        out.append("flashmla")
    if _knob("DEEPINFER_NV_DEEPGEMM") == "1" and has("deep_gemm") and major == 10:
        out.append("deepgemm")
    return tuple(out)
