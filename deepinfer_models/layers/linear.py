"""Linear layers over checkpoint-layout weights (bf16, FP8 block-scaled, MXFP4).

The loader hands over the checkpoint tensors untouched; the linear keeps them in
that layout and calls the gemm op resolved for it once at load time.
"""
from __future__ import annotations

from typing import Callable

import torch

from deepinfer_core.kernels.ops.quant import dequant_fp8_block, dequant_mxfp4


class Linear:
    """``y = x @ W^T`` for W [out, in] stored as ``fmt``.

    fmt: "dense" (weight in a float dtype), "fp8" (float8_e4m3fn weight + block scale
    [ceil(out/bn), ceil(in/bk)]), "mxfp4" (uint8 [out, in/2] + e8m0 scale [out, in/32]).
    """

    def __init__(self, name: str, weight: torch.Tensor, scale: torch.Tensor | None, fmt: str,
                 block: tuple[int, int] | None, kernels: dict[str, Callable], compute_dtype: torch.dtype):
        self.name, self.fmt, self.block = name, fmt, block
        self.scale = scale
        self.compute_dtype = compute_dtype
        self.dense_fn = kernels.get("gemm.dense")
        if fmt == "dense":
            self.weight = weight.to(compute_dtype) if compute_dtype is not None else weight
            self._fn = kernels["gemm.dense"]
        elif fmt == "fp8":
            self.weight = weight
            self._fn = kernels["gemm.fp8_block"]
        elif fmt == "mxfp4":
            self.weight = weight.view(torch.uint8) if weight.dtype == torch.int8 else weight
            self._fn = kernels["gemm.mxfp4"]
        else:
            raise ValueError(f"{name}: unknown weight format {fmt!r}")

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, in] -> [T, out] in x.dtype."""
        if self.fmt == "dense":
            return self._fn(x, self.weight)
        if self.fmt == "fp8":
            return self._fn(x, self.weight, self.scale, self.block)
        return self._fn(x, self.weight, self.scale)

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight as a float [out, in] tensor (for grouped / fused uses in references)."""
        if self.fmt == "dense":
            return self.weight.to(dtype)
        if self.fmt == "fp8":
            return dequant_fp8_block(self.weight, self.scale, self.block).to(dtype)
        return dequant_mxfp4(self.weight, self.scale).to(dtype)
