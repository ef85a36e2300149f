"""Fused mHC sublayer boundary (``mhc.pre_norm``, ``mhc.expand_pre_norm``): two launches instead of five.

Run as their parts, a sublayer boundary is ``mhc.expand`` (the previous sublayer's output into the streams),
``mhc.mix`` (projection, then gate), ``mhc.collapse`` and ``norm.rms``: five launches of a few microseconds
each, 16 boundaries a step on the 8-layer slice. Fused:

1. ``_expand_proj_kernel``, one program per (tile of ``BLOCK_T`` tokens, D range): the new streams
   ``R'[t, j, d] = sum_i comb[t, i, j] R[t, i, d] + post[t, j] y[t, d]`` for every stream j of its D range,
   stored in the residual's dtype, and from those stored values the mix's partial sums: ``sum(R'^2)`` and the
   projection ``fn[:, j*D + d] . R'[t, j, d]`` (one ``[BLOCK_T, n*BLOCK_D] x [n*BLOCK_D, 24]`` dot a D tile).
   ``mhc.pre_norm`` (no ``y``) reads R as it is and stores nothing.
2. ``_gate_norm_kernel``, one program per token: ``triton_mhc``'s gate (``_gate_math``), then the collapse
   ``x = sum_k p[k] R'[t, k]`` with ``p`` the new ``pre`` or the given ``collapse_pre``, rounded to the
   residual's dtype as ``mhc.collapse`` stores it, and ``norm.rms`` of x, with the whole row in registers.

The split over D is taken from D alone and ``BLOCK_T`` is fixed, so a token's sums never depend on the batch:
the launch is batch-invariant, and the ``triton_bi`` provider uses it as the ``triton`` one does.

Opt-in until measured on the H200: ``DEEPINFER_NV_MHC_FUSED=1`` (read at import; ``FUSED``). Off, or for
operands the kernels do not cover (``_covers``), or at prefill sizes (``MAX_T`` tokens and more, default
provider only), both ops run as their parts, ``triton_mhc`` and ``triton_norm`` (``mix_bi`` for
``triton_bi``).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from deepinfer_core.kernels.ops.mhc import compose_expand_pre_norm, compose_pre_norm
from deepinfer_nvidia.kernels import triton_mhc, triton_norm
from deepinfer_nvidia.kernels._common import FLOATS, next_pow2, on_cuda
from deepinfer_nvidia.kernels.triton_mhc import _gate_math, _store_weights, bf16_pieces_dot
from deepinfer_nvidia.kernels.triton_pdl import pdl_enter, pdl_launch

FUSED = os.environ.get("DEEPINFER_NV_MHC_FUSED", "0") == "1"
MAX_T = triton_mhc.TF32X3_MIN_T  # the default provider hands prefill-sized calls to the parts (tf32x3 there)
BLOCK_T = 16  # tokens per projection program (fixed: batch invariance)
BLOCK_D = 16  # columns of each stream a dot step takes: a [16, n*16] x [n*16, 32] product at n 4
# 8 warps and a 2-stage pipeline: 181 registers and no spills for sm_90a (Triton 3.9, ``sass_count``); 4 warps or
# BLOCK_D 32 use all 255 and spill
PROJ_WARPS, PROJ_STAGES = 8, 2
MAX_SPLITS = 64  # D ranges; the 24 x n*D fp32 fn matrix (2 MB at V4.1's width) is spread over this many programs
MAX_D = 16384  # the gate-and-norm program keeps a whole row in registers


@triton.jit
def _expand_proj_kernel(r_ptr, y_ptr, post_ptr, comb_ptr, out_ptr, fn_ptr, part_ptr, ss_ptr, T, D, R, d_per,
                        N: tl.constexpr, NR: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
                        EXPAND: tl.constexpr, SPLIT_FN: tl.constexpr, PDL: tl.constexpr = 0):
    pdl_enter(PDL)
    sp = tl.program_id(1)
    rt = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    tmask = rt < T
    row = rt.to(tl.int64) * (N * D)  # [BLOCK_T] offset of token t's streams
    # a D tile of every stream as one 2-D tile: lane kk is stream j = kk // BLOCK_D, column d0 + kk % BLOCK_D (so the
    # projection is one dot a tile, and nothing is reshaped)
    kk = tl.arange(0, N * BLOCK_D)
    j = kk // BLOCK_D
    dd = kk % BLOCK_D
    rr = tl.arange(0, NR)
    rmask = rr < R
    acc = tl.zeros([BLOCK_T, NR], dtype=tl.float32)
    ss = tl.zeros([BLOCK_T], dtype=tl.float32)
    d_lo = sp * d_per
    d_hi = tl.minimum(d_lo + d_per, D)
    if EXPAND:
        post = tl.load(post_ptr + rt[:, None] * N + j[None, :], mask=tmask[:, None], other=0.0)  # [BT, N*BD]
    for d0 in range(d_lo, d_hi, BLOCK_D):
        col = d0 + dd
        m2 = tmask[:, None] & (col < d_hi)[None, :]
        if EXPAND:
            # R'[t, j, d] = sum_i comb[t, i, j] R[t, i, d] + post[t, j] y[t, d]; the N lanes of one (i, d) load the
            # same element (an L1 hit after the first)
            mixed = tl.zeros([BLOCK_T, N * BLOCK_D], dtype=tl.float32)
            for i in tl.static_range(N):
                r_i = tl.load(r_ptr + row[:, None] + i * D + col[None, :], mask=m2, other=0.0).to(tl.float32)
                c_i = tl.load(comb_ptr + rt[:, None] * (N * N) + i * N + j[None, :], mask=tmask[:, None], other=0.0)
                mixed += c_i * r_i
            y = tl.load(y_ptr + rt[:, None].to(tl.int64) * D + col[None, :], mask=m2, other=0.0).to(tl.float32)
            v = (mixed + post * y).to(out_ptr.dtype.element_ty)
            tl.store(out_ptr + row[:, None] + j[None, :] * D + col[None, :], v, mask=m2)
        else:
            v = tl.load(r_ptr + row[:, None] + j[None, :] * D + col[None, :], mask=m2, other=0.0)
        xf = v.to(tl.float32)  # the stored values, as mhc.mix reads them
        ss += tl.sum(xf * xf, axis=1)
        f = tl.load(fn_ptr + rr[:, None].to(tl.int64) * (N * D) + j[None, :] * D + col[None, :],
                    mask=rmask[:, None] & (col < d_hi)[None, :], other=0.0)  # [NR, N*BD]
        if SPLIT_FN:  # bf16 streams are exact in bf16: fn in three bf16 pieces (triton_mhc._proj_kernel)
            acc += bf16_pieces_dot(v, f)
        else:
            acc += tl.dot(xf, tl.trans(f), input_precision="ieee")
    off = (sp * T + rt[:, None]).to(tl.int64) * NR + rr[None, :]
    tl.store(part_ptr + off, acc, mask=tmask[:, None])
    tl.store(ss_ptr + sp * T + rt, ss, mask=tmask)


@triton.jit
def _gate_norm_kernel(part_ptr, ss_ptr, base_ptr, scale_ptr, pre_ptr, post_ptr, comb_ptr, r_ptr, cpre_ptr, w_ptr,
                      h_ptr, T, D, n, norm_eps, hc_eps, iters, rms_eps, NR: tl.constexpr, NP: tl.constexpr,
                      SPLITS: tl.constexpr, BLOCK: tl.constexpr, CHUNK: tl.constexpr, HAS_CPRE: tl.constexpr,
                      PDL: tl.constexpr = 0):
    pdl_enter(PDL)
    t = tl.program_id(0)
    pre, post, c = _gate_math(part_ptr, ss_ptr, base_ptr, scale_ptr, t, T, n * D, n, norm_eps, hc_eps, iters,
                              NR=NR, NP=NP, SPLITS=SPLITS)
    _store_weights(pre_ptr, post_ptr, comb_ptr, t, n, pre, post, c, NP=NP)
    k = tl.arange(0, NP)
    if HAS_CPRE:
        p = tl.load(cpre_ptr + t * n + k, mask=k < n, other=0.0)
    else:
        p = pre
    base = t.to(tl.int64) * n * D
    hrow = h_ptr + t.to(tl.int64) * D
    if CHUNK >= BLOCK:  # the whole row in registers (many warps)
        cols = tl.arange(0, BLOCK)
        cmask = cols < D
        xq = _collapse_cols(r_ptr, base, D, cols, cmask, p, k, n, NP).to(h_ptr.dtype.element_ty).to(tl.float32)
        inv = 1.0 / tl.sqrt(tl.sum(xq * xq, axis=0) / D + rms_eps)
        w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
        tl.store(hrow + cols, (w * (xq * inv)).to(h_ptr.dtype.element_ty), mask=cmask)
    else:
        # few warps (the gate's Sinkhorn rounds are cheapest on one warp): the row in CHUNK pieces, twice. The first
        # pass stores the rounded collapse (mhc.collapse's stored value) into h and sums its squares; the second
        # reads it back (the same lanes wrote it: the load and the store share one layout) and normalises.
        sq = tl.zeros([CHUNK], dtype=tl.float32)
        for c0 in range(0, D, CHUNK):
            cols = c0 + tl.arange(0, CHUNK)
            cmask = cols < D
            xq = _collapse_cols(r_ptr, base, D, cols, cmask, p, k, n, NP).to(h_ptr.dtype.element_ty)
            tl.store(hrow + cols, xq, mask=cmask)
            xf = xq.to(tl.float32)
            sq += xf * xf
        inv = 1.0 / tl.sqrt(tl.sum(sq, axis=0) / D + rms_eps)
        for c0 in range(0, D, CHUNK):
            cols = c0 + tl.arange(0, CHUNK)
            cmask = cols < D
            xq = tl.load(hrow + cols, mask=cmask, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
            tl.store(hrow + cols, (w * (xq * inv)).to(h_ptr.dtype.element_ty), mask=cmask)


@triton.jit
def _collapse_cols(r_ptr, base, D, cols, cmask, p, k, n, NP: tl.constexpr):
    """fp32 ``sum_i p[i] R[t, i, cols]`` (``base``: token t's offset), the streams in order."""
    x = tl.zeros(cols.shape, dtype=tl.float32)
    for i in tl.static_range(NP):
        if i < n:
            p_i = tl.sum(tl.where(k == i, p, 0.0), axis=0)  # exact: one nonzero term
            x += p_i * tl.load(r_ptr + base + i * D + cols, mask=cmask, other=0.0).to(tl.float32)
    return x


_PARTS = {"mhc.mix": triton_mhc.mix, "mhc.collapse": triton_mhc.collapse, "norm.rms": triton_norm.rms,
          "mhc.expand": triton_mhc.expand}
_PARTS_BI = dict(_PARTS, **{"mhc.mix": triton_mhc.mix_bi})
_pre_norm_parts, _expand_pre_norm_parts = compose_pre_norm(_PARTS), compose_expand_pre_norm(_PARTS)
_pre_norm_parts_bi, _expand_pre_norm_parts_bi = compose_pre_norm(_PARTS_BI), compose_expand_pre_norm(_PARTS_BI)


def _covers(residual, fn, base, scale, norm_w, collapse_pre=None, y=None, post=None, comb=None,
            force_kernel: bool = False) -> bool:
    """CUDA (or, with ``force_kernel``, CPU for Triton's interpreter) residual [T, n, D] in fp32 / bf16 / fp16,
    n a power of two <= 8, D <= ``MAX_D``; fp32 mix weights, collapse_pre, post and comb; y in the residual's
    dtype."""
    ts = [t for t in (residual, fn, base, scale, norm_w, collapse_pre, y, post, comb) if t is not None]
    if not (force_kernel or on_cuda(*ts)) or residual.dtype not in FLOATS or residual.dim() != 3:
        return False
    n, d = residual.shape[1], residual.shape[2]
    fp32 = [fn, base, scale] + [t for t in (collapse_pre, post, comb) if t is not None]
    return ((n & (n - 1)) == 0 and 1 <= n <= 8 and 1 <= d <= MAX_D and all(t.dtype == torch.float32 for t in fp32)
            and norm_w.dtype in FLOATS and (y is None or y.dtype == residual.dtype))


def supports_pre_norm(residual, fn, base, scale, norm_w, norm_eps, hc_eps, sinkhorn_iters, collapse_pre=None
                      ) -> bool:
    """Operands the fused ``mhc.pre_norm`` covers (``_covers``)."""
    return _covers(residual, fn, base, scale, norm_w, collapse_pre)


def supports_expand_pre_norm(residual, y, post, comb, fn, base, scale, norm_w, norm_eps, hc_eps, sinkhorn_iters,
                             collapse_pre=None) -> bool:
    """Operands the fused ``mhc.expand_pre_norm`` covers (``_covers``)."""
    return _covers(residual, fn, base, scale, norm_w, collapse_pre, y, post, comb)


def _check_shapes(op, residual, fn, base, scale, norm_w, collapse_pre, y, post, comb) -> None:
    t, n, d = residual.shape
    rows = (2 + n) * n
    want = {"fn": (fn, (rows, n * d)), "base": (base, (rows,)), "scale": (scale, (3,)), "norm_w": (norm_w, (d,)),
            "collapse_pre": (collapse_pre, (t, n)), "y": (y, (t, d)), "post": (post, (t, n)),
            "comb": (comb, (t, n, n))}
    for name, (tensor, shape) in want.items():
        if tensor is not None and tuple(tensor.shape) != shape:
            raise ValueError(f"{op}: for residual [{t}, {n}, {d}] {name} must be {list(shape)}, "
                             f"got {list(tensor.shape)}")


def _launch(residual, y, post, comb, fn, base, scale, norm_w, norm_eps, hc_eps, sinkhorn_iters, collapse_pre,
            split_fn: bool | None = None, launch: dict | None = None):
    """Both kernels; returns ``(residual' or None, h, pre, post', comb')``. ``launch`` overrides the launch shape
    (benchmarks, tests): ``splits`` (a power of two), ``block_d``, ``proj_warps``, ``proj_stages``, ``gate_warps``,
    ``chunk`` (a power of two; the row in one piece when >= the row's block)."""
    if int(sinkhorn_iters) < 1:
        raise ValueError(f"mhc fused: sinkhorn_iters must be >= 1, got {sinkhorn_iters}")
    t, n, d = residual.shape
    dev, rows = residual.device, (2 + n) * n
    nr = max(16, next_pow2(rows))
    pre = torch.empty(t, n, dtype=torch.float32, device=dev)
    post_out = torch.empty(t, n, dtype=torch.float32, device=dev)
    comb_out = torch.empty(t, n, n, dtype=torch.float32, device=dev)
    h = torch.empty(t, d, dtype=residual.dtype, device=dev)
    expand = y is not None
    new = torch.empty_like(residual) if expand else None
    if t == 0:
        return new, h, pre, post_out, comb_out
    lo = launch or {}
    bd = lo.get("block_d", BLOCK_D)
    splits = 1
    while splits < lo.get("splits", MAX_SPLITS) and d // (splits * 2) >= bd:
        splits *= 2
    d_per = triton.cdiv(triton.cdiv(d, splits), bd) * bd
    part = torch.empty(splits, t, nr, dtype=torch.float32, device=dev)
    ss = torch.empty(splits, t, dtype=torch.float32, device=dev)
    x = residual.contiguous()
    if split_fn is None:
        split_fn = x.dtype == torch.bfloat16 and triton_mhc.DECODE_SPLIT_FN
    _expand_proj_kernel[(triton.cdiv(t, BLOCK_T), splits)](
        x, y.contiguous() if expand else x, post.contiguous() if expand else x, comb.contiguous() if expand else x,
        new if expand else x, fn.contiguous(), part, ss, t, d, rows, d_per, N=n, NR=nr, BLOCK_T=BLOCK_T,
        BLOCK_D=bd, EXPAND=expand, SPLIT_FN=split_fn, num_warps=lo.get("proj_warps", PROJ_WARPS),
        num_stages=lo.get("proj_stages", PROJ_STAGES), **pdl_launch())
    block = next_pow2(d)
    warps, chunk = gate_launch(block)
    warps, chunk = lo.get("gate_warps", warps), min(block, lo.get("chunk", chunk))
    _gate_norm_kernel[(t,)](
        part, ss, base.contiguous(), scale.contiguous(), pre, post_out, comb_out, new if expand else x,
        collapse_pre.contiguous() if collapse_pre is not None else pre, norm_w.contiguous(), h, t, d, n,
        float(norm_eps), float(hc_eps), int(sinkhorn_iters), float(norm_eps), NR=nr, NP=max(2, n), SPLITS=splits,
        BLOCK=block, CHUNK=chunk, HAS_CPRE=collapse_pre is not None, num_warps=warps, **pdl_launch())
    return new, h, pre, post_out, comb_out


# The gate-and-norm program: GATE_WARPS warps, the row in GATE_CHUNK-column pieces (two passes). The thirtieth
# pass's shape (the whole row in registers, 16 warps at V4.1's 5120 columns) made the V4.1 batch-1 step 0.33 ms
# slower on an H100 (pass31a): the gate's Sinkhorn rounds are chains of small reductions, which cross warps
# through shared memory and CTA barriers with more than one warp (triton_mhc.DECODE_GATE_WARPS).
GATE_WARPS, GATE_CHUNK = 1, 1024


def gate_launch(block: int) -> tuple[int, int]:
    """(warps, chunk) of the gate-and-norm program for a row of ``block`` (a power of two) columns: ``GATE_WARPS``
    and ``GATE_CHUNK`` columns a piece (``block`` itself when smaller)."""
    return GATE_WARPS, min(block, GATE_CHUNK)


def gate_warps(block: int) -> int:
    """Warps that keep a whole row of ``block`` columns in registers without spilling (sm_90a): 4 up to 4096, then
    16 (8 warps spill at 8192, 16 do not up to 16384: ``tests/kernels/test_fused_kernels_sass.py``)."""
    return 4 if block <= 4096 else 16


def _fused(t: int, batch_invariant: bool, force_kernel: bool, covers) -> bool:
    """Run the fused kernels (else the parts): switched on, decode-sized or batch-invariant, operands covered
    (``covers()``, asked last: switched off, the default eager step pays nothing for the check)."""
    return (FUSED or force_kernel) and (batch_invariant or t < MAX_T) and covers()


def pre_norm(residual: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor,
             norm_w: torch.Tensor, norm_eps: float, hc_eps: float, sinkhorn_iters: int,
             collapse_pre: torch.Tensor | None = None, batch_invariant: bool = False, force_kernel: bool = False,
             split_fn: bool | None = None, launch: dict | None = None) -> tuple:
    """``mhc.pre_norm`` (residual [T, n, D] -> h [T, D] in residual.dtype, fp32 pre, post [T, n], comb [T, n, n]).

    ``force_kernel`` runs the kernels whatever ``FUSED`` says, on CPU tensors too (Triton's interpreter, tests
    only); ``split_fn`` overrides the bf16-pieces product (the interpreter's bf16 dots are wrong); ``launch`` the
    launch shape (``_launch``)."""
    covers = lambda: _covers(residual, fn, base, scale, norm_w, collapse_pre, force_kernel=force_kernel)  # noqa: E731
    if not _fused(residual.shape[0], batch_invariant, force_kernel, covers):
        parts = _pre_norm_parts_bi if batch_invariant else _pre_norm_parts
        return parts(residual, fn, base, scale, norm_w, norm_eps, hc_eps, sinkhorn_iters, collapse_pre)
    _check_shapes("mhc.pre_norm", residual, fn, base, scale, norm_w, collapse_pre, None, None, None)
    return _launch(residual, None, None, None, fn, base, scale, norm_w, norm_eps, hc_eps, sinkhorn_iters,
                   collapse_pre, split_fn, launch)[1:]


def expand_pre_norm(residual: torch.Tensor, y: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
                    fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, norm_w: torch.Tensor, norm_eps: float,
                    hc_eps: float, sinkhorn_iters: int, collapse_pre: torch.Tensor | None = None,
                    batch_invariant: bool = False, force_kernel: bool = False, split_fn: bool | None = None,
                    launch: dict | None = None) -> tuple:
    """``mhc.expand_pre_norm``: returns ``(residual' [T, n, D], h [T, D], pre, post', comb')``; arguments as the
    reference's, the keywords as ``pre_norm``'s."""
    covers = lambda: _covers(residual, fn, base, scale, norm_w, collapse_pre, y, post, comb,  # noqa: E731
                             force_kernel=force_kernel)
    if not _fused(residual.shape[0], batch_invariant, force_kernel, covers):
        parts = _expand_pre_norm_parts_bi if batch_invariant else _expand_pre_norm_parts
        return parts(residual, y, post, comb, fn, base, scale, norm_w, norm_eps, hc_eps, sinkhorn_iters,
                     collapse_pre)
    _check_shapes("mhc.expand_pre_norm", residual, fn, base, scale, norm_w, collapse_pre, y, post, comb)
    return _launch(residual, y, post, comb, fn, base, scale, norm_w, norm_eps, hc_eps, sinkhorn_iters,
                   collapse_pre, split_fn, launch)


def pre_norm_bi(*args, **kwargs) -> tuple:
    """``mhc.pre_norm``, batch-invariant (the fused launch at every size; the parts with ``mix_bi`` when off)."""
    return pre_norm(*args, batch_invariant=True, **kwargs)


def expand_pre_norm_bi(*args, **kwargs) -> tuple:
    """``mhc.expand_pre_norm``, batch-invariant."""
    return expand_pre_norm(*args, batch_invariant=True, **kwargs)
