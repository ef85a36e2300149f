"""``gemm.dense`` at decode sizes: a split-K Triton GEMV for 1-4 rows and small weights, cuBLAS otherwise.

Why (docs/performance.md, twenty-first pass). In the V4.1 slice's batch-1 step the small float projections that
``gemm.dense`` serves (the MoE router [384, 5120] and the compressors' ``wkv`` / ``wgate`` [d, 5120], fp32) ran as
15 cuBLAS launches, ~83 us of kernel time for ~5-10 MB each (~1.5 TB/s). cuBLAS kernels also sit outside the
programmatic-dependent-launch chain (``triton_pdl``): the kernel after one cannot launch until it completes.
This kernel starts with ``pdl_enter`` like the step's other Triton kernels, and each program loads its whole
weight tile (16 rows x 512 fp32 columns: 32 KB, 64 values a thread) with one burst of independent loads, so a
5-10 MB matrix is in flight at once across a few hundred programs.

Numerics are the reference's (``y = x @ w.to(x.dtype)^T``): the weight is rounded to x's dtype first, the products
and sums are fp32, and y is rounded to x's dtype once. Only the order of the fp32 sums differs from cuBLAS's
(a fixed tree per tile, then the K splits added in split order by the last program of each row tile to arrive),
so the result does not depend on timing, but it does depend on the split, which follows the weight shape and the
row count: this provider is not batch-invariant (``gemm_dense_bi`` is).

Rows above ``GEMV_MAX_ROWS``, weights above ``GEMV_MAX_ELEMS`` elements (the vocabulary head: cuBLAS streams it at
the copy bandwidth already) and operands the kernel does not cover go to ``aten_ops.gemm_dense``.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from deepinfer_core.kernels.ops.gemm import _check_x, check_dense_wide, dense, dense_wide, wide_dtype
from deepinfer_nvidia.kernels._common import FLOATS, hand_off, next_pow2
from deepinfer_nvidia.kernels.aten_ops import gemm_dense as cublas_dense
from deepinfer_nvidia.kernels.aten_ops import supports_dense  # the same operands: the kernel's or cuBLAS's
from deepinfer_nvidia.kernels.l2_prefetch import prefetch_asm
from deepinfer_nvidia.kernels.triton_pdl import pdl_enter, pdl_launch
from deepinfer_nvidia.kernels.wide_copies import widened

# rows served (``DEEPINFER_NV_DENSE_GEMV_ROWS=0`` hands every call to cuBLAS, for A/B runs). ``gemm.dense_wide`` at
# 5-64 rows through this kernel (x rows in blocks of 4 as more programs, so that a weight stored in bf16 would not be
# widened into an fp32 copy every call above 4 rows) was bit-stable and far slower than the casts and cuBLAS: the
# router [384, 5120] at 32 rows 86.9 us against 26.7, the V4.1 batch-32 step +750 us (H100, forty-fourth pass,
# commit ``db3a92e``), so it was removed.
GEMV_MAX_ROWS = int(os.environ.get("DEEPINFER_NV_DENSE_GEMV_ROWS", "4"))
GEMV_MAX_ELEMS = 1 << 26  # 64 M weight elements (256 MB of fp32)
BLOCK_N = 16
TILE_ELEMS = 8192  # BLOCK_M x BLOCK_N x BLOCK_K products a tile: 64 a thread of 4 warps (BLOCK_K 512 at 1 row)
MAX_SPLIT = 16  # the last program adds at most this many partials (an unrolled loop of independent loads)
PROGRAMS = 4  # programs per SM to aim for with the K split
# Under PDL, each program asks L2 for its first weight tile (``prefetch.global.L2``, one 128-byte line a request)
# before its wait, so the weights stream while the kernel before it runs (at one row the router's 7.9 MB are one
# tile a program). A prefetch returns nothing and L2 is coherent, so the result cannot change. On since the
# thirty-ninth pass (H100, ``probe_early_weights --router``: an RMSNorm and the router GEMV 9.69 -> 9.12 us, bit-equal;
# 4 rows 17.52 -> 16.89); ``DEEPINFER_NV_DENSE_EARLY_L2=0``: off.
EARLY_L2 = os.environ.get("DEEPINFER_NV_DENSE_EARLY_L2", "1") == "1"
# One row's call in one pass (on; ``DEEPINFER_NV_DENSE_ONE_PASS=0``: off): where ``plan`` splits K,
# programs of a few weight rows over the whole K instead (``one_pass_plan``: the router [384, 5120] as 384 programs of
# one 10 KB bf16 row, against 24 x 10 programs and a second phase in which the last of each row tile's ten adds their
# fp32 partials). pass45d / pass46c (H100, batch 1): the router takes ~11 us on the chain in each MoE layer for 4 MB,
# ~7 us alone; the split's partial stores, arrival counter and re-read are a dependent round trip after the weights'.
# Another fp32 summation order than the split's (within the op's tolerance, as that one is). Forty-seventh pass (H100,
# pass47a/b, 16 readings an arm): batch 1 -19 us pipelined (lower or equal in every one of 16 alternated pairs), batch
# 32 even.
ONE_PASS = os.environ.get("DEEPINFER_NV_DENSE_ONE_PASS", "1") == "1"
ONE_PASS_MAX_K = 8192  # the whole row in one tile (TILE_ELEMS products a program)
_PF_LINE = tl.constexpr(prefetch_asm(0))


@triton.jit
def _split_products(x_ptr, w_ptr, M, N, K, stride_x, stride_w, k_per_split, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, WIDEN: tl.constexpr):
    """This program's tile (``tl.program_id(0)``: w rows ``rn``) and K split (``tl.program_id(1)``) times x's rows:
    ``(acc, rn, nmask, out, omask)``, acc fp32 [BLOCK_M, BLOCK_N] (each K tile's products summed in a fixed tree, the
    tiles in order), ``out``/``omask`` the tile's offsets and mask in an [M, N] output."""
    rm = tl.arange(0, BLOCK_M)
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mmask = rm < M
    nmask = rn < N
    k_lo = tl.program_id(1) * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        kmask = rk < k_hi
        w = tl.load(w_ptr + rn[:, None].to(tl.int64) * stride_w + rk[None, :], mask=nmask[:, None] & kmask[None, :],
                    other=0.0)
        x = tl.load(x_ptr + rm[:, None].to(tl.int64) * stride_x + rk[None, :], mask=mmask[:, None] & kmask[None, :],
                    other=0.0)
        if WIDEN:  # gemm.dense_wide: x widened (exact), w as it is
            wv = w.to(tl.float32)
        else:
            wv = w.to(x_ptr.dtype.element_ty).to(tl.float32)  # the reference casts w to x's dtype first
        acc += tl.sum(x.to(tl.float32)[:, None, :] * wv[None, :, :], axis=2)
    return acc, rn, nmask, rm[:, None] * N + rn[None, :], mmask[:, None] & nmask[None, :]


@triton.jit
def _prefetch_first_tile(w_ptr, N, K, stride_w, k_per_split, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Ask L2 for the 128-byte lines of this program's first K tile of w (rows ``rn``, BLOCK_K columns of its split)."""
    EB: tl.constexpr = w_ptr.dtype.element_ty.primitive_bitwidth // 8
    PER: tl.constexpr = 128 // EB  # elements a line
    LINES: tl.constexpr = BLOCK_K // PER if BLOCK_K >= PER else 1
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k_lo = tl.program_id(1) * k_per_split
    cols = k_lo + tl.arange(0, LINES) * PER
    ok = (rn[:, None] < N) & (cols[None, :] < tl.minimum(k_lo + k_per_split, K))
    ptr = w_ptr + rn[:, None].to(tl.int64) * stride_w + cols[None, :]
    tl.inline_asm_elementwise(_PF_LINE, "=r,l,r", [ptr, ok.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _split_total(part_ptr, out, omask, M, N, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The SPLIT fp32 partials [SPLIT, M, N] of a tile added in split order (whichever program arrived last), read
    from L2 (``.cg``: other programs wrote them)."""
    total = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for sk in tl.static_range(SPLIT):
        total += tl.load(part_ptr + sk * M * N + out, mask=omask, other=0.0, cache_modifier=".cg")
    return total


@triton.jit
def _dense_gemv_kernel(x_ptr, w_ptr, y_ptr, part_ptr, cnt_ptr, M, N, K, stride_x, stride_w, k_per_split,
                       SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       PDL: tl.constexpr = 0, WIDEN: tl.constexpr = 0, EARLY: tl.constexpr = 0):
    """Program (row tile of BLOCK_N weight rows, K split): ``y[m, n] = sum_k x[m, k] * w[n, k]`` over this split's
    K range, m < M <= BLOCK_M. x [M, K] (row stride ``stride_x``), w [N, K] (row stride ``stride_w``), y [M, N] in
    x's dtype (WIDEN: in w's dtype, x widened to it instead of w rounded to x's); part [SPLIT, M, N] fp32 and cnt
    (zeroed int32 per row tile, reset here) when SPLIT > 1. EARLY (under PDL, ``EARLY_L2``): the first weight tile
    asked of L2 before the wait."""
    if PDL and EARLY:  # weights: requested while the kernel before runs (a prefetch writes nothing)
        _prefetch_first_tile(w_ptr, N, K, stride_w, k_per_split, BLOCK_N, BLOCK_K)
    pdl_enter(PDL)
    pid_n = tl.program_id(0)
    acc, rn, nmask, out, omask = _split_products(x_ptr, w_ptr, M, N, K, stride_x, stride_w, k_per_split, BLOCK_M,
                                                 BLOCK_N, BLOCK_K, WIDEN)
    if SPLIT == 1:
        tl.store(y_ptr + out, acc.to(y_ptr.dtype.element_ty), mask=omask)
    else:
        tl.store(part_ptr + tl.program_id(1) * M * N + out, acc, mask=omask)
        tl.debug_barrier()  # every thread's partial is stored before the arrival is counted
        if tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel") == SPLIT - 1:
            total = _split_total(part_ptr, out, omask, M, N, SPLIT, BLOCK_M, BLOCK_N)
            tl.store(y_ptr + out, total.to(y_ptr.dtype.element_ty), mask=omask)
            tl.atomic_xchg(cnt_ptr + pid_n, 0)


def plan(m: int, n: int, k: int, sms: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_K, K split) for an [m <= GEMV_MAX_ROWS, k] x [n, k]^T launch on ``sms`` SMs: tiles of
    TILE_ELEMS products (BLOCK_M x BLOCK_N x BLOCK_K), then the smallest split up to MAX_SPLIT that gives
    PROGRAMS per SM, evened out so that no split is empty."""
    bm = next_pow2(m)
    bk = max(16, TILE_ELEMS // (bm * BLOCK_N))
    k_tiles = triton.cdiv(k, bk)
    want = triton.cdiv(PROGRAMS * sms, triton.cdiv(n, BLOCK_N))
    split = max(1, min(MAX_SPLIT, k_tiles, want))
    per = triton.cdiv(k_tiles, split)
    return bm, bk, triton.cdiv(k_tiles, per)


def one_pass_plan(m: int, k: int) -> tuple[int, int] | None:
    """(BLOCK_N, BLOCK_K) of ``ONE_PASS``'s launch for an [m, k] x [n, k]^T call, or None where it does not apply
    (more than one row, or a row wider than ``ONE_PASS_MAX_K``): the whole K in one tile, as many weight rows a
    program as keep it at TILE_ELEMS products."""
    if m != 1 or k > ONE_PASS_MAX_K:
        return None
    bk = max(16, next_pow2(k))
    return max(1, TILE_ELEMS // bk), bk


def launch_plan(m: int, n: int, k: int, sms: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, K split) that ``gemv`` launches: ``plan``'s split tiling, or, where it would split
    K and ``ONE_PASS`` is on, ``one_pass_plan``'s single pass when the call qualifies."""
    bm, bk, split = plan(m, n, k, sms)
    single = one_pass_plan(m, k) if ONE_PASS and split > 1 else None
    if single is None:
        return bm, BLOCK_N, bk, split
    return bm, single[0], single[1], 1


def takes(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Operands this kernel serves (the rest go to cuBLAS): 1..GEMV_MAX_ROWS rows of a float x, a float 2-D w of
    at most GEMV_MAX_ELEMS elements with unit column stride, K a multiple of 4 (16-byte fp32 rows)."""
    return (x.dim() == 2 and w.dim() == 2 and 1 <= x.shape[0] <= GEMV_MAX_ROWS and x.dtype in FLOATS
            and w.dtype in FLOATS and w.numel() <= GEMV_MAX_ELEMS and w.shape[1] == x.shape[1]
            and w.shape[1] % 4 == 0 and w.stride(1) == 1 and w.shape[0] > 0)


def gemv(x: torch.Tensor, w: torch.Tensor, sms: int, widen: bool = False, out_dtype: torch.dtype | None = None
         ) -> torch.Tensor:
    """The kernel's launch for ``takes`` operands (CUDA, or CPU tensors under Triton's interpreter: tests); ``widen``:
    ``gemm.dense_wide``'s numerics (y in w's dtype, x widened to it; both widened to fp32 in the kernel, so ``widen``
    with ``out_dtype=torch.float32`` is the fp32 product of a half-precision w as it is stored)."""
    from deepinfer_nvidia.kernels.triton_fp8_gemv import _counters

    m, (n, k) = x.shape[0], w.shape
    x = x if x.stride(1) == 1 else x.contiguous()
    bm, bn, bk, split = launch_plan(m, n, k, sms)
    k_per = triton.cdiv(triton.cdiv(k, bk), split) * bk
    tiles = triton.cdiv(n, bn)
    y = torch.empty(m, n, dtype=out_dtype or (w.dtype if widen else x.dtype), device=x.device)
    part = torch.empty(split, m, n, dtype=torch.float32, device=x.device) if split > 1 else y
    cnt = _counters(x.device, tiles) if split > 1 else part
    _dense_gemv_kernel[(tiles, split)](x, w, y, part, cnt, m, n, k, x.stride(0), w.stride(0), k_per, SPLIT=split,
                                       BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=4, WIDEN=int(widen),
                                       EARLY=int(EARLY_L2), **pdl_launch())
    return y


def gemm_dense(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``gemm.dense``: x [T, K] @ w [N, K]^T -> [T, N] in x.dtype (w cast to x.dtype): this module's GEMV for
    ``takes`` operands, one cuBLAS GEMM (``aten_ops.gemm_dense``) for the others."""
    if not supports_dense(x, w):
        return hand_off("gemm.dense", f"operands {x.dtype}/{w.dtype} on {x.device} not covered", dense, x, w)
    if w.dim() != 2:
        raise ValueError(f"gemm.dense: w must be [N, K], got shape {tuple(w.shape)}")
    _check_x(x, w.shape[1], "gemm.dense")
    if not takes(x, w):
        return cublas_dense(x, w)
    from deepinfer_nvidia.kernels.triton_gemm import _sm_count

    return gemv(x, w, _sm_count(x.device))


def supports_dense_wide(x: torch.Tensor, w: torch.Tensor) -> bool:
    """CUDA float x and w (fp32 / bf16 / fp16)."""
    return supports_dense(x, w) and w.dtype in FLOATS


def gemm_dense_wide(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``gemm.dense_wide``: x [T, K] @ w [N, K]^T with both widened to ``wide_dtype(w)`` (fp32 for an fp32 or a
    half-precision w) -> [T, N] in it. ``takes`` operands with something to widen into fp32 (x, or a bf16 / fp16 w
    as the checkpoint stores it): this module's GEMV widening them as it loads them (no cast launch, and a half w
    read at half the bytes); the others: ``gemm_dense`` of the widened operands (x cast, a half w's fp32 copy kept
    by ``wide_copies``, then the GEMV or cuBLAS as for ``gemm.dense``)."""
    if not supports_dense_wide(x, w):
        return hand_off("gemm.dense_wide", f"operands {x.dtype}/{w.dtype} on {x.device} not covered", dense_wide,
                        x, w)
    check_dense_wide(x, w)
    wide = wide_dtype(w)
    if wide == torch.float32 and (x.dtype != wide or w.dtype != wide) and takes(x, w):
        from deepinfer_nvidia.kernels.triton_gemm import _sm_count

        return gemv(x, w, _sm_count(x.device), widen=True, out_dtype=wide)
    return gemm_dense(x.to(wide), widened(w, wide))  # a half w's fp32 copy, kept (``wide_copies``)
