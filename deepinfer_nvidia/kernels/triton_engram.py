"""Triton Engram ops (DeepSeek-V4.1): ``engram.gather`` (table rows, dequantised) and ``engram.gate``.

The references (``deepinfer_core/kernels/ops/engram.py``) evaluate the gate one precision up, so for bf16
activations they make float64 copies of the residual streams and keys: at an 8k-token prefill that is
~20 full passes over 0.3-1 GB tensors per Engram layer (fourteenth pass, ``docs/perf/pass14b``). Here:

- ``gather``: one program per ``ROWS`` ids; each row's ``hd`` FP8 bytes are decoded in registers (e4m3 via
  the fp16 bit pattern, exact, NaN kept) and scaled by ``2^(b-127)`` of its UE8M0 byte per 32 values; one
  read of the row, one write in the output dtype.
- ``gate``: one program per (token, stream), so batch 1 runs on ``n`` SMs (``STREAM_PROGRAMS``; with the
  streams one after another in one program it took 10.3 us a call). Each program reads the shared value row,
  its stream row and its key once, reduces the three sums (``R.R``, ``key.key``, ``R.(q_w k_w key)``) in fp32
  and writes the gated row.

Both are row-wise with a fixed reduction order, so a row's bits do not depend on the batch (batch-invariant
as launched). The gate computes in fp32 where the reference computes in fp64: agreement within the fp32
conformance bound (1e-4), checked on the H200 and under the CPU interpreter.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from deepinfer_core.kernels.ops.engram import SCALE_GROUP, gate as gate_reference, gather_rows
from deepinfer_nvidia.kernels._common import FLOATS, hand_off, next_pow2, on_cuda
from deepinfer_nvidia.kernels.triton_pdl import pdl_enter, pdl_launch

_FP8 = (torch.float8_e4m3fn,)
_UE8M0 = (torch.uint8, torch.float8_e8m0fnu)


@triton.jit
def _e4m3_to_f32(b):
    """uint8-valued int32 e4m3fn codes -> fp32 (exact; 0x7f / 0xff -> NaN). The 7 magnitude bits shifted
    into an fp16's exponent and mantissa give ``value * 2^-8`` (bias 15 against 7), subnormals included."""
    h = ((b & 0x7F) << 7) | ((b & 0x80) << 8)
    v = h.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32) * 256.0
    return tl.where((b & 0x7F) == 0x7F, float("nan"), v)


@triton.jit
def _engram_gather_kernel(table_ptr, scale_ptr, ids_ptr, out_ptr, n_ids, HD, FP8: tl.constexpr, ROWS: tl.constexpr,
                   BLOCK: tl.constexpr, GROUP: tl.constexpr):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rm = r < n_ids
    idx = tl.load(ids_ptr + r, mask=rm, other=0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = rm[:, None] & (cols < HD)[None, :]
    src = idx[:, None] * HD + cols[None, :]
    if FP8:
        v = _e4m3_to_f32(tl.load(table_ptr + src, mask=m, other=0).to(tl.int32))
        sb = tl.load(scale_ptr + idx[:, None] * (HD // GROUP) + cols[None, :] // GROUP, mask=m, other=127)
        sb = sb.to(tl.int32)
        s = tl.where(sb == 255, float("nan"), tl.exp2((tl.minimum(sb, 254) - 127).to(tl.float32)))
        v = v * s
    else:
        v = tl.load(table_ptr + src, mask=m, other=0.0).to(tl.float32)
    dst = r.to(tl.int64)[:, None] * HD + cols[None, :]
    tl.store(out_ptr + dst, v.to(out_ptr.dtype.element_ty), mask=m)


def supports_gather(table: torch.Tensor, scale: torch.Tensor | None, ids: torch.Tensor,
                    out_dtype: torch.dtype) -> bool:
    """A CUDA table (FP8 with UE8M0 scales per 32 values, or float without), CUDA ids, a float output dtype.
    Tables left in host memory (memory-mapped checkpoints) run the reference where they are."""
    return on_cuda(table, scale, ids) and _gather_covered(table, scale, ids, out_dtype)


def _gather_covered(table, scale, ids, out_dtype) -> bool:
    if not (table.dim() == 2 and table.is_contiguous() and out_dtype in FLOATS and not ids.is_floating_point()):
        return False
    hd = table.shape[1]
    if scale is None:
        return table.dtype in FLOATS
    return (table.dtype in _FP8 and scale.dtype in _UE8M0 and scale.is_contiguous() and hd % SCALE_GROUP == 0
            and tuple(scale.shape) == (table.shape[0], hd // SCALE_GROUP))


def gather(table: torch.Tensor, scale: torch.Tensor | None, ids: torch.Tensor, out_dtype: torch.dtype,
           force_kernel: bool = False) -> torch.Tensor:
    """``engram.gather``: table [R, hd], scale [R, hd/32] or None, ids [...] int -> [..., hd] ``out_dtype``.
    ``force_kernel`` runs on CPU tensors (Triton's interpreter, tests only)."""
    if not (supports_gather(table, scale, ids, out_dtype) or force_kernel and _gather_covered(table, scale, ids,
                                                                                             out_dtype)):
        return hand_off("engram.gather", f"table {table.dtype} on {table.device} not covered", gather_rows,
                        table, scale, ids, out_dtype)
    hd = table.shape[1]
    flat = ids.reshape(-1)
    flat = flat if flat.is_contiguous() else flat.contiguous()
    out = torch.empty(flat.numel(), hd, dtype=out_dtype, device=table.device)
    if flat.numel() == 0:
        return out.view(*ids.shape, hd)
    block = next_pow2(hd)
    rows = max(1, min(32, 4096 // block))
    fp8 = scale is not None
    tab = table.view(torch.uint8) if fp8 else table
    sc = scale.view(torch.uint8) if fp8 else tab
    _engram_gather_kernel[(triton.cdiv(flat.numel(), rows),)](tab, sc, flat, out, flat.numel(), hd, FP8=fp8,
                                                              ROWS=rows, BLOCK=block, GROUP=SCALE_GROUP, num_warps=4)
    return out.view(*ids.shape, hd)


@triton.jit
def _engram_gate_kernel(r_ptr, kv_ptr, qw_ptr, kw_ptr, out_ptr, D, eps, clamp, inv_sqrt_d, N: tl.constexpr,
                        BLOCK: tl.constexpr, STREAMS: tl.constexpr = 1, PDL: tl.constexpr = 0):
    """Program (token t, stream block): the gated rows of streams ``STREAMS * block ..`` (``STREAMS`` of them,
    one after another; N a multiple of STREAMS). Each program reads the shared value row once."""
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    cm = cols < D
    kv_row = kv_ptr + t * ((N + 1) * D)
    value = tl.load(kv_row + N * D + cols, mask=cm, other=0.0).to(tl.float32)
    for j in tl.static_range(STREAMS):
        k = tl.program_id(1) * STREAMS + j
        r = tl.load(r_ptr + (t * N + k) * D + cols, mask=cm, other=0.0).to(tl.float32)
        key = tl.load(kv_row + k * D + cols, mask=cm, other=0.0).to(tl.float32)
        w = tl.load(qw_ptr + k * D + cols, mask=cm, other=0.0).to(tl.float32) * \
            tl.load(kw_ptr + k * D + cols, mask=cm, other=0.0).to(tl.float32)
        rstd = (1.0 / tl.sqrt(tl.sum(r * r, axis=0) / D + eps)) * (1.0 / tl.sqrt(tl.sum(key * key, axis=0) / D + eps))
        dot = tl.sum(r * w * key, axis=0) * rstd * inv_sqrt_d
        mag = tl.sqrt(tl.maximum(tl.abs(dot), clamp))
        g = tl.sigmoid(tl.where(dot < 0, -mag, mag))
        tl.store(out_ptr + (t * N + k) * D + cols, (r + g * value).to(out_ptr.dtype.element_ty), mask=cm)


# One program per (token, stream) instead of per token (``DEEPINFER_NV_ENGRAM_STREAM_PROGRAMS=0``: per token, the
# streams one after another). At batch 1 the per-token launch is one program on one SM: 10.3 us a call in the
# twenty-fourth pass's profile for ~0.2 MB. The stream programs each read the shared value row (n+1 row reads
# more per token); the arithmetic of each stream is the same, so a row's bits do not depend on the choice.
STREAM_PROGRAMS = os.environ.get("DEEPINFER_NV_ENGRAM_STREAM_PROGRAMS", "1") == "1"


def supports_gate(residual: torch.Tensor, kv: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                  eps: float, clamp: float) -> bool:
    """CUDA float operands of the reference's shapes, rows up to 16384 wide."""
    return on_cuda(residual, kv, q_weight, k_weight) and _gate_covered(residual, kv, q_weight, k_weight)


def _gate_covered(residual, kv, q_weight, k_weight) -> bool:
    if not (residual.dim() == 3 and kv.dim() == 2):
        return False
    t, n, d = residual.shape
    return (residual.dtype in FLOATS and kv.dtype in FLOATS and q_weight.dtype in FLOATS and k_weight.dtype in FLOATS
            and tuple(kv.shape) == (t, (n + 1) * d) and tuple(q_weight.shape) == (n, d)
            and tuple(k_weight.shape) == (n, d) and d <= 16384)


def gate(residual: torch.Tensor, kv: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float,
         clamp: float, force_kernel: bool = False) -> torch.Tensor:
    """``engram.gate``: residual [T, n, D], kv [T, (n+1)*D], q_weight / k_weight [n, D] -> [T, n, D] in
    residual.dtype: each stream plus its sigmoid gate times the shared value (fp32 math). ``force_kernel``
    runs on CPU tensors (Triton's interpreter, tests only)."""
    if not (supports_gate(residual, kv, q_weight, k_weight, eps, clamp)
            or force_kernel and _gate_covered(residual, kv, q_weight, k_weight)):
        return hand_off("engram.gate", f"operands {residual.dtype} on {residual.device} not covered", gate_reference,
                        residual, kv, q_weight, k_weight, eps, clamp)
    t, n, d = residual.shape
    r, kvc = residual.contiguous(), kv.contiguous()
    out = torch.empty_like(r)
    if t == 0:
        return out
    block = next_pow2(d)
    streams = 1 if STREAM_PROGRAMS else n
    _engram_gate_kernel[(t, n // streams)](r, kvc, q_weight.contiguous(), k_weight.contiguous(), out, d, float(eps),
                                           float(clamp), float(d) ** -0.5, N=n, BLOCK=block, STREAMS=streams,
                                           num_warps=8 if block >= 2048 else 4, **pdl_launch())
    return out
