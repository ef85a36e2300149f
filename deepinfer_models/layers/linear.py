"""Linear layers over checkpoint-layout weights (bf16, FP8 block-scaled, MXFP4).

The loader hands over the checkpoint tensors untouched; the linear keeps them in
that layout and calls the gemm op resolved for it once at load time.
"""
from __future__ import annotations

import itertools
import os
from typing import Callable

import torch

from deepinfer_core.kernels.ops.quant import dequant_fp8_block, dequant_mxfp4

# Projections that read one input run as one product over their weights stacked by rows (``LinearGroup``): wq_a
# with wkv, wq_b with the indexer's wq_b (V4's CSA layers, V4.1's index layers), V4.1's ratio-2 compressors' wkv
# with wgate, and the shared expert's w1 with w3. On by default since the thirty-third pass: on the measured device it took
# 70-100 us off a V4.1 batch-1 step (2.48 / 2.56 -> 2.41 / 2.46 ms in two alternations), kept batch 64 even or
# faster and the V4 batch-32 step even (docs/performance.md). ``DEEPINFER_MERGE_PROJECTIONS=0`` runs them apart
# (read at import, looked up when a layer is built).
MERGE_PROJECTIONS = os.environ.get("DEEPINFER_MERGE_PROJECTIONS", "1") == "1"
# The fp32 projections of V4 / V4.1 (the MoE router, the compressors' wkv / wgate) are stored in bf16 by the FP8 / FP4
# checkpoints. By default (since the forty-fourth pass) they stay as stored, and ``gemm.dense_wide`` (and
# ``moe.router_topk``) widen them as they read them: the same products bit for bit from half the bytes a step (the
# roofline counts the stored bytes). Measured on an H100 (docs/performance_pass_44.md, pass44e, alternated twice):
# batch 1 -15 us, V4.1 batch 32 and V4 batch 32 even, now that the GPU platform's ``gemm.dense_wide`` keeps a half
# weight's fp32 copy for its cuBLAS calls above 4 rows (before, a cast a call cost +65 us at batch 32, pass44b, and
# +220 us in the thirty-seventh pass). ``DEEPINFER_NATIVE_FLOAT_PROJECTIONS=0`` widens them to fp32 once, at load.
NATIVE_FLOAT_PROJECTIONS = os.environ.get("DEEPINFER_NATIVE_FLOAT_PROJECTIONS", "1") == "1"


def float_projection(w: torch.Tensor) -> torch.Tensor:
    """A weight of an fp32 projection (``gemm.dense_wide``'s w): as stored with ``NATIVE_FLOAT_PROJECTIONS`` (a
    float), else widened to fp32 once, here."""
    return w if NATIVE_FLOAT_PROJECTIONS and w.is_floating_point() else w.float()


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


class LinearGroup:
    """Linears that read the same input, run as one product over their weights stacked by rows where they can be.

    ``group(x)`` returns each member's output (``x [T, in] -> ([T, out_0], [T, out_1], ...)``, column slices of one
    product when merged); ``group.part(i)`` is a callable for member i alone (the merged product, sliced: for the
    rare caller that needs one member). Why: at decode sizes a small GEMV costs a fixed latency (the weights'
    first bytes, the split-K reduction) of several times its bytes, so two GEMVs over one input cost nearly two
    floors; merged they cost one.

    Members merge only where each output column of the one product reads the same weights and scales as the member's
    own (its sums may round in another order, as any change of launch shape does): the same format, input width and
    block, and for FP8 every member but the last a whole number of ``block[0]``-row scale blocks (so the scale rows
    stack too). Otherwise, or with ``merge=False``, the members run one after another, as before."""

    def __init__(self, members: list[Linear], merge: bool = True):
        self.members = members
        self.sizes = [m.out_features for m in members]
        self.merged = merge and len(members) > 1 and self.can_merge(members)
        if self.merged:
            first = members[0]
            weight = torch.cat([m.weight for m in members], dim=0)
            scale = torch.cat([m.scale for m in members], dim=0) if first.scale is not None else None
            self.linear = _like(first, "+".join(m.name for m in members), weight, scale)
            # the members keep row views of the stacked tensors (no second copy of the weights): part() and
            # dequantized() of a member read the same bytes
            w_rows = [0, *itertools.accumulate(self.sizes)]
            s_rows = [r // first.block[0] for r in w_rows] if first.fmt == "fp8" else w_rows
            for i, m in enumerate(members):
                m.weight = weight[w_rows[i]:w_rows[i + 1]]
                if scale is not None:
                    m.scale = scale[s_rows[i]:s_rows[i + 1]] if i < len(members) - 1 or first.fmt != "fp8" \
                        else scale[s_rows[i]:]

    @staticmethod
    def can_merge(members: list[Linear]) -> bool:
        """Same format, input width, block and dtypes; FP8 members but the last cover whole scale-block rows."""
        first = members[0]
        same = all(m.fmt == first.fmt and m.block == first.block and m.weight.shape[1:] == first.weight.shape[1:]
                   and m.weight.dtype == first.weight.dtype and m.weight.device == first.weight.device
                   and (m.scale is None) == (first.scale is None)
                   and (m.scale is None or (m.scale.dtype == first.scale.dtype
                                            and m.scale.shape[1:] == first.scale.shape[1:]))
                   for m in members)
        if not same:
            return False
        if first.fmt == "fp8":
            return first.block is not None and all(m.out_features % first.block[0] == 0 for m in members[:-1])
        return True

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x [T, in] -> each member's [T, out_i] in x.dtype."""
        if not self.merged:
            return tuple(m(x) for m in self.members)
        return tuple(self.linear(x).split(self.sizes, dim=-1))

    def part(self, i: int):
        """Member i as a callable ``x -> [T, out_i]``."""
        if not self.merged:
            return self.members[i]
        return lambda x: self(x)[i]


def _like(first: Linear, name: str, weight: torch.Tensor, scale: torch.Tensor | None) -> Linear:
    """A Linear with ``first``'s format, block, kernels and compute dtype over the stacked ``weight`` / ``scale``
    (already in the members' stored dtypes: nothing is converted again)."""
    merged = Linear.__new__(Linear)
    merged.__dict__.update(first.__dict__)
    merged.name, merged.weight, merged.scale = name, weight, scale
    return merged
