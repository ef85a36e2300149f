"""Provider ``aten``: ops served by vendor libraries through torch's CUDA operators.

Not Triton kernels, so they carry their own provider name: cuBLAS for
``gemm.dense`` (one GEMM instead of the reference's 8-row tiles, which exist
only to make the CPU reference batch-invariant), and CUTLASS grouped GEMMs
(``torch._grouped_mm``, SM90 bf16) for ``moe.experts`` with no host sync and
no Python loop over experts. Neither is batch-invariant in the last bits:
cuBLAS picks its kernel by shape. The conformance harness checks them against
the references with the ops' tolerances like any other provider.
"""
from __future__ import annotations

import os

import torch

from deepinfer_core.kernels.ops.gemm import _check_x, dense
from deepinfer_core.kernels.ops.moe import clamped_swiglu, experts_dense
from deepinfer_nvidia.kernels._common import FLOATS, hand_off, on_cuda


def supports_dense(x: torch.Tensor, w: torch.Tensor) -> bool:
    return on_cuda(x, w) and x.dtype in FLOATS and w.is_floating_point()


# ``DEEPINFER_NV_DENSE_SPLITK=S`` (opt-in, prepared in the twenty-ninth pass and not yet measured): fp32 calls of
# 5-64 rows on small weights run as S K-slices through one strided-batched cuBLAS GEMM, then a sum. Why: in the V4
# batch-32 step (pass29a) the 8 fp32 GEMMs [32, 4096] x [4096, 256 / 512 / 1024] took 126 us for ~16 us of bytes;
# cuBLAS's kernels for them are 32x32-tile GEMMs with 8-32 programs. Predicted -50 to -80 us a batch-32 V4 step.
SPLITK_ENV = "DEEPINFER_NV_DENSE_SPLITK"
SPLITK_MAX_ROWS = 64
SPLITK_MIN_K = 2048
SPLITK_MAX_ELEMS = 1 << 24  # 16 M weight elements (64 MB of fp32): past that the GEMM has programs enough


def splitk_splits() -> int:
    """``DEEPINFER_NV_DENSE_SPLITK``: 0 or 1 (unset: 0) keeps one GEMM; 2-32 K slices; anything else is refused."""
    raw = os.environ.get(SPLITK_ENV, "").strip() or "0"
    if not raw.isdigit() or int(raw) > 32:
        raise ValueError(f"{SPLITK_ENV} must be an integer 0-32 (K slices of fp32 gemm.dense calls), got {raw!r}")
    return int(raw)


def splitk_takes(x: torch.Tensor, w: torch.Tensor, splits: int) -> bool:
    """fp32 x and w, 5..SPLITK_MAX_ROWS rows (fewer go to the Triton GEMV), K >= SPLITK_MIN_K and divisible
    by ``splits``, a weight of at most SPLITK_MAX_ELEMS elements."""
    return (splits > 1 and x.dtype == w.dtype == torch.float32 and x.dim() == w.dim() == 2
            and 4 < x.shape[0] <= SPLITK_MAX_ROWS and x.shape[1] == w.shape[1] >= SPLITK_MIN_K
            and x.shape[1] % splits == 0 and w.numel() <= SPLITK_MAX_ELEMS)


def splitk_mm(x: torch.Tensor, w: torch.Tensor, splits: int) -> torch.Tensor:
    """x [M, K] @ w [N, K]^T in fp32 as ``splits`` K slices: one batched GEMM [S, M, K/S] x [S, K/S, N] on
    strided views (no copies), then the S partials summed in slice order. Products and sums are fp32; only the
    order of the sums differs from one GEMM (not batch-invariant, as cuBLAS is not)."""
    m, k = x.shape
    n = w.shape[0]
    kc = k // splits
    xs = x.view(m, splits, kc).transpose(0, 1)  # [S, M, Kc]
    ws = w.view(n, splits, kc).permute(1, 2, 0)  # [S, Kc, N]
    return torch.bmm(xs, ws).sum(0)


SPLITK = splitk_splits()  # read once, at import (the platform imports its kernels when it resolves them)


def gemm_dense(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``gemm.dense``: ``x [T, K] @ w [N, K]^T -> [T, N]`` in x.dtype (w cast to x.dtype), one cuBLAS GEMM
    (or ``splitk_mm`` with ``DEEPINFER_NV_DENSE_SPLITK``, above).

    fp32 operands run in full fp32 (torch's default ``allow_tf32=False`` for matmul).
    """
    if not supports_dense(x, w):
        return hand_off("gemm.dense", f"operands {x.dtype}/{w.dtype} on {x.device} not covered", dense, x, w)
    if w.dim() != 2:
        raise ValueError(f"gemm.dense: w must be [N, K], got shape {tuple(w.shape)}")
    _check_x(x, w.shape[1], "gemm.dense")
    if splitk_takes(x, w, SPLITK):
        return splitk_mm(x, w, SPLITK)
    return x @ w.to(x.dtype).t()


def _grouped_mm_available() -> bool:
    if not hasattr(torch, "_grouped_mm") or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability() >= (9, 0)


def supports_experts(x, weights, ids, w1, w3, w2, limit) -> bool:
    """CUDA bf16 x with bf16 [E, F, D] / [E, D, F] expert stacks on SM90+, D and F multiples of 8."""
    return (on_cuda(x, weights, ids, w1, w3, w2) and x.dtype == torch.bfloat16
            and w1.dtype == w3.dtype == w2.dtype == torch.bfloat16 and w1.dim() == 3 and x.dim() == 2
            and x.shape[1] % 8 == 0 and w1.shape[1] % 8 == 0 and _grouped_mm_available())


def moe_experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor,
                w2: torch.Tensor, limit: float) -> torch.Tensor:
    """``moe.experts`` with grouped GEMMs: tokens sorted by expert, three grouped products, weighted combine.

    x [T, D] bf16; weights [T, k] fp32; ids [T, k] int; w1, w3 [E, F, D]; w2 [E, D, F]. Returns [T, D] bf16.
    Only the experts that received tokens are read (empty groups launch no tiles).
    """
    if not supports_experts(x, weights, ids, w1, w3, w2, limit):
        return hand_off("moe.experts", f"operands x {x.dtype} w {w1.dtype} on {x.device} not covered",
                        experts_dense, x, weights, ids, w1, w3, w2, limit)
    t, d = x.shape
    e, f, d1 = w1.shape
    if d1 != d or w3.shape != w1.shape or w2.shape != (e, d, f):
        raise ValueError(f"moe.experts: x [T, {d}] needs w1/w3 [E, F, {d}] and w2 [E, {d}, F]; got "
                         f"{tuple(w1.shape)}, {tuple(w3.shape)}, {tuple(w2.shape)}")
    if ids.shape != weights.shape or ids.shape[0] != t:
        raise ValueError(f"moe.experts: ids {tuple(ids.shape)} and weights {tuple(weights.shape)} must both be [{t}, k]")
    k = ids.shape[1]
    if t == 0 or k == 0:
        return torch.zeros_like(x)
    flat = ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    tok = order // k
    # counts by scatter_add, not bincount: CUDA's bincount reads the max id on the host (a sync that
    # would make the decode step uncapturable)
    counts = torch.zeros(e, dtype=torch.long, device=x.device).scatter_add_(0, flat, torch.ones_like(flat))
    offs = torch.cumsum(counts, 0).to(torch.int32)
    xs = x.index_select(0, tok)  # [T*k, D], grouped by expert
    h1 = torch._grouped_mm(xs, w1.transpose(1, 2), offs=offs)
    h3 = torch._grouped_mm(xs, w3.transpose(1, 2), offs=offs)
    h = clamped_swiglu(h1, h3, limit)
    y = torch._grouped_mm(h, w2.transpose(1, 2), offs=offs)  # [T*k, D]
    y = y.float() * weights.reshape(-1).float().index_select(0, order)[:, None]
    out = torch.zeros(t, d, dtype=torch.float32, device=x.device)
    out.index_add_(0, tok, y)
    return out.to(x.dtype)


def _compact(ids: torch.Tensor, dequant) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """Dequantise only the routed experts into bf16 stacks; ids remapped to the compact order."""
    used, remap = torch.unique(ids, return_inverse=True)
    stacks = dequant(used)
    return remap.reshape(ids.shape), stacks


def supports_experts_quant(x, weights, ids, *rest) -> bool:
    return on_cuda(x, weights, ids) and x.dtype == torch.bfloat16 and x.shape[1] % 8 == 0 and _grouped_mm_available()


def moe_experts_fp8(x, weights, ids, w1, s1, w3, s3, w2, s2, block, limit):
    """``moe.experts_fp8``: dequantise the routed experts' FP8 blocks to bf16, then grouped GEMMs."""
    from deepinfer_core.kernels.ops.moe import experts_fp8
    from deepinfer_core.kernels.ops.quant import dequant_fp8_block

    if not supports_experts_quant(x, weights, ids):
        return hand_off("moe.experts_fp8", f"operands x {x.dtype} on {x.device} not covered",
                        experts_fp8, x, weights, ids, w1, s1, w3, s3, w2, s2, block, limit)

    def dq(used):
        return tuple(torch.stack([dequant_fp8_block(w[e], s[e], tuple(block)) for e in used.tolist()]).to(torch.bfloat16)
                     for w, s in ((w1, s1), (w3, s3), (w2, s2)))

    local, (d1, d3, d2) = _compact(ids, dq)
    return moe_experts(x, weights, local, d1, d3, d2, limit)


def moe_experts_mxfp4(x, weights, ids, w1, s1, w3, s3, w2, s2, limit):
    """``moe.experts_mxfp4``: dequantise the routed experts' MXFP4 weights to bf16 (either layout), then grouped
    GEMMs."""
    from deepinfer_core.kernels.ops.moe import experts_mxfp4
    from deepinfer_core.kernels.ops.mxfp4_words import expert_bytes
    from deepinfer_core.kernels.ops.quant import dequant_mxfp4

    if not supports_experts_quant(x, weights, ids):
        return hand_off("moe.experts_mxfp4", f"operands x {x.dtype} on {x.device} not covered",
                        experts_mxfp4, x, weights, ids, w1, s1, w3, s3, w2, s2, limit)

    def dq(used):
        return tuple(dequant_mxfp4(expert_bytes(w[used]).flatten(0, 1), s[used].flatten(0, 1))
                     .view(len(used), w.shape[1], -1).to(torch.bfloat16) for w, s in ((w1, s1), (w3, s3), (w2, s2)))

    local, (d1, d3, d2) = _compact(ids, dq)
    return moe_experts(x, weights, local, d1, d3, d2, limit)
