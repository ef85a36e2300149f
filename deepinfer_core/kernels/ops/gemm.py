"""GEMM references: dense, FP8-block-quantised and MXFP4 weights.

All ops compute ``y = x @ W^T`` for activations ``x [T, K]`` and a weight
``W [N, K]`` (nn.Linear layout), returning ``[T, N]`` in ``x.dtype``. The
quantised references dequantise the weight with the format definitions in
``quant.py``, cast it to ``x.dtype`` and multiply, so a provider kernel that
accumulates in fp32 must land within the op's tolerance of this.
"""
from __future__ import annotations

import torch

from deepinfer_core.kernels.ops.quant import (
    dequant_fp8_block,
    dequant_mxfp4,
    quant_fp8_block,
    quant_mxfp4,
)
from deepinfer_core.kernels.ops.linalg import linear_rows
from deepinfer_core.kernels.spec import OpSpec


def _check_x(x: torch.Tensor, k: int, op: str) -> None:
    if x.dim() != 2:
        raise ValueError(f"{op}: x must be [T, K], got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"{op}: x must be a float tensor, got {x.dtype}")
    if x.shape[1] != k:
        raise ValueError(f"{op}: x has K={x.shape[1]} but the weight has K={k}")


def dense(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x [T, K] @ w [N, K]^T -> [T, N]`` in ``x.dtype`` (``w`` cast to ``x.dtype``)."""
    if w.dim() != 2:
        raise ValueError(f"gemm.dense: w must be [N, K], got shape {tuple(w.shape)}")
    _check_x(x, w.shape[1], "gemm.dense")
    return linear_rows(x, w)


def wide_dtype(w: torch.Tensor) -> torch.dtype:
    """``gemm.dense_wide``'s product dtype for a weight ``w``: w's own when it is fp32 / fp64, fp32 for a
    half-precision w (bf16 / fp16, as a checkpoint stores it: widened, exactly)."""
    return w.dtype if w.dtype.itemsize >= 4 else torch.float32


def dense_wide(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x [T, K] @ w [N, K]^T -> [T, N]`` with both widened to ``wide_dtype(w)`` (fp32 unless w is fp64) and the
    product in it: the fp32 projections of a half-precision activation (the MoE router, the compressors' ``wkv`` /
    ``wgate``: a widening, exact), ``gemm.dense(x.float(), w.float())`` without the casts as kernels of their own.
    w may be fp32, or bf16 / fp16 as the checkpoint stores it (the same product, half the bytes to read)."""
    check_dense_wide(x, w)
    wide = wide_dtype(w)
    return dense(x.to(wide), w.to(wide))


def check_dense_wide(x: torch.Tensor, w: torch.Tensor) -> None:
    """``gemm.dense_wide``'s operand contract (the providers raise the same errors): w a 2-D float [N, K], x [T, K]."""
    if w.dim() != 2:
        raise ValueError(f"gemm.dense_wide: w must be [N, K], got shape {tuple(w.shape)}")
    _check_x(x, w.shape[1], "gemm.dense_wide")
    if not w.is_floating_point():
        raise TypeError(f"gemm.dense_wide: w must be a float tensor, got {w.dtype}")


def fp8_block(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """``x [T, K]`` times an FP8 block weight -> ``[T, N]`` in ``x.dtype``.

    ``q [N, K]`` float8_e4m3fn, ``scale [ceil(N/bn), ceil(K/bk)]`` fp32 or UE8M0;
    ``= x @ dequant_fp8_block(q, scale, block).to(x.dtype).T``.
    """
    if q.dim() != 2:
        raise ValueError(f"gemm.fp8_block: q must be [N, K], got shape {tuple(q.shape)}")
    _check_x(x, q.shape[1], "gemm.fp8_block")
    return linear_rows(x, dequant_fp8_block(q, scale, tuple(block)))


def fp8_block_grouped(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, block: tuple[int, int],
                      groups: int) -> torch.Tensor:
    """G FP8 block weights applied to G column groups of x: V4's grouped output projection ``wo_a``.

    ``x [T, G*Kg]``, ``q [G*Ng, Kg]`` float8_e4m3fn (group g's weight is rows ``g*Ng .. (g+1)*Ng``),
    ``scale`` the stacked weight's block scale ``[G*Ng/bn, ceil(Kg/bk)]``; ``Ng`` must be a multiple of
    ``bn`` so every scale row belongs to one group. Returns ``[T, G*Ng]`` in ``x.dtype``: column block g is
    ``fp8_block(x[:, g*Kg:(g+1)*Kg], q[g*Ng:(g+1)*Ng], scale rows of g, block)``.
    """
    g = int(groups)
    if q.dim() != 2:
        raise ValueError(f"gemm.fp8_block_grouped: q must be [G*Ng, Kg], got shape {tuple(q.shape)}")
    if g < 1 or q.shape[0] % g:
        raise ValueError(f"gemm.fp8_block_grouped: {q.shape[0]} weight rows do not split into {groups} groups")
    ng, kg = q.shape[0] // g, q.shape[1]
    if ng % int(block[0]):
        raise ValueError(f"gemm.fp8_block_grouped: group rows {ng} are not a multiple of the scale block "
                         f"{int(block[0])}")
    _check_x(x, g * kg, "gemm.fp8_block_grouped")
    sb = ng // int(block[0])
    return torch.cat([fp8_block(x[:, i * kg:(i + 1) * kg], q[i * ng:(i + 1) * ng], scale[i * sb:(i + 1) * sb],
                                block) for i in range(g)], dim=-1)


def mxfp4(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x [T, K]`` times an MXFP4 weight -> ``[T, N]`` in ``x.dtype``.

    ``packed [N, K//2]`` uint8/int8 (two e2m1 per byte, low nibble first),
    ``scale [N, K//32]`` float8_e8m0fnu.
    """
    if packed.dim() != 2:
        raise ValueError(f"gemm.mxfp4: packed must be [N, K/2], got shape {tuple(packed.shape)}")
    _check_x(x, 2 * packed.shape[1], "gemm.mxfp4")
    return linear_rows(x, dequant_mxfp4(packed, scale))


# -- input generators (CPU tensors built from ``seed``, then moved to ``device``) --
_SHAPES = [(1, 64, 128), (7, 200, 300), (16, 256, 512), (33, 96, 64)]  # (T, N, K); 200x300 has partial blocks


def _gen_dense(dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    for t, n, k in _SHAPES:
        x = torch.randn(t, k, generator=g).to(dtype).to(device)
        w = (torch.randn(n, k, generator=g) / k ** 0.5).to(dtype).to(device)
        yield (x, w), {}


def _gen_dense_wide(dtype, device, seed):
    """fp32 weights, and the first case's weight also in bf16 (as a checkpoint stores a router)."""
    for i, ((x, w), kw) in enumerate(_gen_dense(dtype, device, seed)):
        yield (x, w.float()), kw
        if i == 0:
            yield (x, w.bfloat16()), kw


def _gen_fp8_block(dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    for (t, n, k), block, fmt in zip(_SHAPES, [(128, 128), (128, 128), (32, 32), (128, 128)],
                                     [None, "ue8m0", "ue8m0", None]):
        x = torch.randn(t, k, generator=g).to(dtype).to(device)
        q, s = quant_fp8_block(torch.randn(n, k, generator=g) / k ** 0.5, block, fmt)
        yield (x, q.to(device), s.to(device), block), {}


def _gen_fp8_block_grouped(dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    for t, groups, ng, kg, block, fmt in [(1, 8, 64, 128, (32, 32), "ue8m0"), (5, 2, 128, 256, (128, 128), None),
                                          (17, 4, 32, 96, (32, 32), "ue8m0"), (3, 1, 64, 64, (32, 32), None)]:
        x = torch.randn(t, groups * kg, generator=g).to(dtype).to(device)
        q, s = quant_fp8_block(torch.randn(groups * ng, kg, generator=g) / kg ** 0.5, block, fmt)
        yield (x, q.to(device), s.to(device), block, groups), {}


def _gen_mxfp4(dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    for t, n, k in [(1, 64, 128), (5, 96, 256), (16, 128, 64)]:
        x = torch.randn(t, k, generator=g).to(dtype).to(device)
        packed, s = quant_mxfp4(torch.randn(n, k, generator=g) / k ** 0.5)
        yield (x, packed.to(device), s.to(device)), {}


# Quantised weights are exact after dequantisation; the looser bf16 bound covers
# kernels that accumulate in fp32 while the reference rounds the product to bf16.
_QUANT_TOL = {torch.bfloat16: (3e-2, 3e-2), torch.float16: (3e-3, 3e-3)}

OPS = [
    OpSpec("gemm.dense", dense, _gen_dense, doc="y = x @ w^T"),
    OpSpec("gemm.dense_wide", dense_wide, _gen_dense_wide,
           doc="y = x @ w^T with both widened to fp32 (fp64 for an fp64 w), in that dtype"),
    OpSpec("gemm.fp8_block", fp8_block, _gen_fp8_block, tolerances=_QUANT_TOL,
           doc="y = x @ dequant_fp8_block(q, scale, block)^T"),
    OpSpec("gemm.fp8_block_grouped", fp8_block_grouped, _gen_fp8_block_grouped, tolerances=_QUANT_TOL,
           doc="G column groups of x times G stacked FP8 block weights (the grouped output projection)"),
    OpSpec("gemm.mxfp4", mxfp4, _gen_mxfp4, tolerances=_QUANT_TOL, doc="y = x @ dequant_mxfp4(packed, scale)^T"),
]
