"""NVIDIA kernel implementations, registered lazily into core's KernelRegistry.

Each entry of :data:`IMPLS` is ``(op, provider, "module:attr", supports)``:
metadata only. Nothing under this package is imported until the registry
resolves an op to one of these providers, so registering never imports triton.
One provider family per module (``triton_norm.py``, ``flashmla.py``, ...).

Providers: ``triton`` (Triton kernels, one module per op family) and
``aten`` (vendor libraries through torch's CUDA operators: cuBLAS, CUTLASS
grouped GEMM). Ops listed nowhere here run core's reference on the device.
"""
from __future__ import annotations

from typing import Any

# (op, provider, target, supports-target or None[, batch_invariant]). Providers are tried in the
# order of NvidiaPlatform.default_providers.
_K = "deepinfer_nvidia.kernels"
IMPLS: tuple[tuple, ...] = (
    # batch-invariant: one program per row (norm) or per element (rope); no reduction spans rows
    ("norm.rms", "triton", f"{_K}.triton_norm:rms", f"{_K}.triton_norm:supports_rms", True),
    ("norm.rms_unweighted", "triton", f"{_K}.triton_norm:rms_unweighted", f"{_K}.triton_norm:supports_rms_unweighted",
     True),
    ("rope.interleaved", "triton", f"{_K}.triton_rope:rope", f"{_K}.triton_rope:supports", True),
    ("attention.sparse_sink", "triton", f"{_K}.triton_attention:sparse_sink", f"{_K}.triton_attention:supports"),
    ("index.scores", "triton", f"{_K}.triton_indexer:scores", f"{_K}.triton_indexer:supports"),
    ("mhc.mix", "triton", f"{_K}.triton_mhc:mix", f"{_K}.triton_mhc:supports"),
    ("mhc.collapse", "triton", f"{_K}.triton_mhc:collapse", f"{_K}.triton_mhc:supports_collapse"),
    ("mhc.expand", "triton", f"{_K}.triton_mhc:expand", f"{_K}.triton_mhc:supports_expand"),
    ("gemm.fp8_block", "triton", f"{_K}.triton_gemm:gemm_fp8_block", f"{_K}.triton_gemm:supports_fp8"),
    ("gemm.mxfp4", "triton", f"{_K}.triton_gemm:gemm_mxfp4", f"{_K}.triton_gemm:supports_mxfp4"),
    ("gemm.dense", "aten", f"{_K}.aten_ops:gemm_dense", f"{_K}.aten_ops:supports_dense"),
    ("moe.experts", "aten", f"{_K}.aten_ops:moe_experts", f"{_K}.aten_ops:supports_experts"),
    ("moe.experts_fp8", "triton", f"{_K}.triton_moe:moe_experts_fp8", f"{_K}.triton_moe:supports"),
    ("moe.experts_mxfp4", "triton", f"{_K}.triton_moe:moe_experts_mxfp4", f"{_K}.triton_moe:supports"),
    ("moe.experts_fp8", "aten", f"{_K}.aten_ops:moe_experts_fp8", f"{_K}.aten_ops:supports_experts_quant"),
    ("moe.experts_mxfp4", "aten", f"{_K}.aten_ops:moe_experts_mxfp4", f"{_K}.aten_ops:supports_experts_quant"),
)


def register(registry: Any) -> list[tuple[str, str]]:
    """Register every NVIDIA implementation in ``registry`` (a KernelRegistry).

    Returns the ``(op, provider)`` pairs registered, for the platform's log line.
    Raises whatever the registry raises for an unknown op or a duplicate
    (op, provider): both are packaging bugs that must not pass silently.
    """
    done = []
    for op, provider, target, supports, *flags in IMPLS:
        registry.register_impl(op, provider, target, supports, batch_invariant=bool(flags and flags[0]))
        done.append((op, provider))
    return done
