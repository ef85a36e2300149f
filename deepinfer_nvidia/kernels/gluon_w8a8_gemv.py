"""``gemm.fp8_block`` for 1-16 rows with MXFP8 activations (opt-in, ``DEEPINFER_NV_MXFP8_ACT=1``): FP8 ``wgmma``
on e4m3 weights and e4m3 activations, both read by the tensor core straight from shared memory.

Why (docs/performance.md, thirty-fifth pass). The bf16 swap-AB GEMV (``gluon_fp8_gemv``) decodes every weight
byte into its ``wgmma`` A fragment: ~293 SASS instructions a warp per 8 KB tile. Here no thread touches a weight
byte: the ``cp.async`` ring lands each [64 rows, 32] e4m3 block in the layout the tensor core reads, and one
``m64nNk32`` FP8 ``wgmma`` per block multiplies it by the activations (~150 instructions a warp a tile at 8 rows).
Measured slower all the same (H100: one V4.1 layer's GEMVs at one row 88.8 -> 95.3-98.5 us, the batch-1 step
2.47 -> 2.52 ms): at one row both kernels are bound by their launches' ramps and drains, not their instructions.

Numerics (the quant spec's, not the bf16 reference's): V4.1's FP8 linears are MXFP8 on both sides in vLLM's
quant spec (``weight=kMxfp8Static, activation=kMxfp8Dynamic``; MODEL_SPEC 3.11) and vLLM runs them so on SM100;
on SM90 vLLM falls back to Marlin's W8A16, which is what ``gluon_fp8_gemv`` matches. So this path is a numerics
choice, off by default. Each program quantises its activation tile itself: per row and 32 columns, the UE8M0 code
``clamp(ceil(log2(amax / 448)) + 127, 0, 254)`` (computed exactly from amax's bits, no division), the e4m3 values
``RNE(x / 2^(code - 127))`` (saturating; ``|x| / scale <= 448`` by the choice of code). Each 32-column block's
``wgmma`` starts from zero and is added to the fp32 sum times ``weight scale * activation scale`` (powers of two), so
no product passes through the tensor core's reduced-precision FP8 accumulation for more than one block.
``mxfp8_quant_reference`` and ``w8a8_reference`` are the pure-torch models the conformance tests compare with.

Split-K partials are summed in split order by the last program of a row tile (as ``gluon_fp8_gemv``), so the
result does not depend on timing. SM90 only (``takes``).
"""
from __future__ import annotations

import os

import torch
import triton

from deepinfer_core.kernels.ops.quant import quant_rows_pow2
from deepinfer_nvidia.kernels import gluon_fp8_gemv as _gemv, gluon_moe_swap as _swap
from deepinfer_nvidia.kernels.triton_pdl import gluon_grid_dependency, pdl_launch

_GLUON = _swap.available()
if _GLUON:
    from deepinfer_nvidia.kernels.gluon_api import (
        REINTERPRET_PUBLIC as _REINTERPRET_PUBLIC,
        async_copy,
        cp_async as _cp_async,
        cta_barrier as _cta_barrier,
        fence_async_shared,
        gl,
        gluon,
        warpgroup_mma,
        warpgroup_mma_init,
        warpgroup_mma_wait,
    )

    _grid_dependency = gluon_grid_dependency

# Off by default: the bf16-activation GEMV is the reference's numerics (see the module docstring).
ENABLED = os.environ.get("DEEPINFER_NV_MXFP8_ACT", "0") == "1"
STAGES = 4  # weight ring depth: 8 KB a stage (4 blocks of [64, 32])
# Quantise x tile i + 1 inside the K loop (two shared slots) instead of all of a program's tiles before it
# (``DEEPINFER_NV_W8A8_XLOOP=1``): the up-front form waits on one x load per tile in turn, as every tile's store is
# followed by a barrier; the in-loop form pays ~80 more instructions and 2 more barriers a tile.
XLOOP = os.environ.get("DEEPINFER_NV_W8A8_XLOOP", "0") == "1"


def mxfp8_quant_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (e4m3 [M, K], UE8M0 codes uint8 [M, K / 32]): the kernel's activation quantisation, core's
    ``quant_rows_pow2`` at 32 columns (the code computed exactly from amax's bits, as the kernel does)."""
    return quant_rows_pow2(x, 32)


def _ue8m0(code: torch.Tensor) -> torch.Tensor:
    """UE8M0 bytes -> float64 2^(code - 127), code 0 as 0.0 (the kernel's ``_pow2``)."""
    c = code.view(torch.uint8).double()
    return torch.where(c == 0, 0.0, torch.exp2(c - 127))


def w8a8_reference(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, bn_blk: int, bk_blk: int) -> torch.Tensor:
    """The pure-torch model of ``gemv_w8a8``: y [M, N] fp32 = dequant(mxfp8(x)) @ dequant(q [N, K] e4m3, s)^T, s the
    UE8M0 bytes [ceil(N / bn_blk), ceil(K / bk_blk)], in float64 (the kernel's own sum differs by fp32 rounding)."""
    xq, code = mxfp8_quant_reference(x)
    xd = xq.double() * _ue8m0(code).repeat_interleave(32, dim=1)
    n, k = q.shape
    sw = _ue8m0(s).repeat_interleave(bn_blk, 0)[:n].repeat_interleave(bk_blk, 1)[:, :k]
    return (xd @ (q.view(torch.float8_e4m3fn).double() * sw).t()).float()


def available() -> bool:
    return _GLUON


if _GLUON:
    @gluon.jit
    def _pow2(code):
        """UE8M0 code (int32, 0..254) -> fp32 2^(code - 127), with code 0 taken as 0.0 (2^-127 is subnormal in fp32;
        no finite bf16 block or checkpoint weight block gets it but an all-zero one, whose products are zero)."""
        return (code << 23).to(gl.float32, bitcast=True)

    @gluon.jit
    def _quantise(xf):
        """x blocks [R, 32] fp32 (one 32-column block of one row each) -> (e4m3 [R, 32], UE8M0 codes [R] int32)."""
        bits = gl.max(gl.abs(xf), axis=1).to(gl.int32, bitcast=True)
        c = ((bits >> 23) & 0xFF) - 135 + ((bits & 0x7FFFFF) > 0x600000).to(gl.int32)
        code = gl.minimum(gl.maximum(c + 127, 0), 254)
        inv = _pow2(254 - code)  # 2^(127 - code): exact (finite bf16 gives code <= 247)
        return (xf * gl.expand_dims(inv, 1)).to(gl.float8e4nv), code

    @gluon.jit
    def _code_rows(codes_s, KT: gl.constexpr, BLOCK_M: gl.constexpr):
        """The code bytes [KT, 4 * BLOCK_M] (tile t, block b, row m at t, b * BLOCK_M + m) viewed as [4 * KT, BLOCK_M]:
        row 4t + b holds block b's codes of tile t (``_reinterpret`` in Triton 3.6)."""
        if _REINTERPRET_PUBLIC:
            return codes_s.reinterpret(gl.int8, [4 * KT, BLOCK_M], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        else:
            return codes_s._reinterpret(gl.int8, [4 * KT, BLOCK_M], gl.SwizzledSharedLayout(1, 1, 1, [0]))

    @gluon.jit
    def _factor(sc, codes_row, SHIFT: gl.constexpr, ACC: gl.constexpr):
        """[64, BLOCK_M] fp32 weight scale * activation scale of one 32-column block: ``sc`` [64] int32 (the block's
        UE8M0 byte at SHIFT), ``codes_row`` the block's [BLOCK_M] activation codes in shared memory."""
        sx = _pow2(codes_row.load(gl.SliceLayout(0, ACC)).to(gl.int32) & 0xFF)
        return gl.expand_dims(_pow2((sc >> SHIFT) & 0xFF), 1) * gl.expand_dims(sx, 0)

    @gluon.jit
    def _issue_w(ring_w, w_ptrs, wmask, j, stage, n_k):
        """cp.async of K tile ``j``'s weights (masked to zero past this program's range) into ring slot ``stage``."""
        _cp_async(ring_w.index(stage), w_ptrs + j * 128, mask=wmask & (j < n_k))
        async_copy.commit_group()

    @gluon.jit
    def _scale_word(s_ptr, s_row, smask, kb, BK_BLK: gl.constexpr):
        """The weight scales of the accumulator's rows for the 4 blocks of the K tile at column ``kb``: one int32 a
        row, block b's UE8M0 byte in byte b (BK_BLK 32: the 4 bytes s[row, kb / 32 ..] read as one word; else one
        byte for all four)."""
        if BK_BLK == 32:
            wp = (s_ptr + s_row + kb // 32).to(gl.pointer_type(gl.int32), bitcast=True)
            return gl.load(wp, mask=smask, other=0x7F7F7F7F)
        else:
            return gl.load(s_ptr + s_row + kb // BK_BLK, mask=smask, other=127).to(gl.int32) * 0x01010101

    @gluon.jit
    def _w8a8_gemv_kernel(x_ptr, q_ptr, s_ptr, y_ptr, part_ptr, cnt_ptr, M, N, K, stride_x, s_cols, NG, k_per_split,
                          BN_BLK: gl.constexpr, BK_BLK: gl.constexpr, SPLIT: gl.constexpr, BLOCK_M: gl.constexpr,
                          STAGES: gl.constexpr, KT: gl.constexpr, PDL: gl.constexpr, num_warps: gl.constexpr,
                          XLOOP: gl.constexpr = 0):
        """Program (row tile of 64 weight rows, K split of at most KT tiles of 128 columns):
        ``y[m, n] = sum_k mxfp8(x)[m, k] * q[n, k] * s``. x [M, K] bf16; q [N, K] e4m3; s UE8M0 bytes
        [ceil(N / BN_BLK), s_cols] (s_cols % 4 == 0 when BK_BLK is 32); y [M, N] bf16; part [SPLIT, M, N] fp32 and cnt
        (zeroed int32 a row tile) when SPLIT > 1; NG rows a weight group (group g reads x columns g*K..(g+1)*K).
        The program first quantises its whole x range into shared memory (KT tiles of [4 * BLOCK_M, 32] e4m3: block b
        of a tile is rows BLOCK_M b.., one ``wgmma`` B operand each), then streams its weights through a ``cp.async``
        ring of [256, 32] e4m3 slots (block b: rows 64b..64b+63, one A operand each). PDL: the first weight tiles
        are requested before the wait; x and every store after it. XLOOP: instead of all KT tiles up front, x tile
        i + 1 is quantised into one of two slots while tile i's ``wgmma`` run (x tile i + 2 loaded meanwhile)."""
        gl.static_assert(num_warps == 4)
        # x blocks [4 * BLOCK_M, 32] of a K tile (row b * BLOCK_M + m: columns 32b..32b+31 of x row m), BLOCK_M
        # elements a thread: the block's amax is a shuffle among 32 / BLOCK_M lanes
        LX: gl.constexpr = gl.BlockedLayout([1, BLOCK_M], [BLOCK_M, 32 // BLOCK_M], [num_warps, 1], [1, 0])
        LW: gl.constexpr = gl.BlockedLayout([1, 16], [16, 2], [num_warps, 1], [1, 0])
        ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_M, 32])
        S32: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=32, element_bitwidth=8, rank=2)
        CODES: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
        pid_n = gl.program_id(0)
        pid_k = gl.program_id(1)
        n0 = pid_n * 64
        k_lo = pid_k * k_per_split
        n_k = gl.cdiv(gl.minimum(k_per_split, K - k_lo), 128)
        # weight copies [256, 32]: row 64b + r is weight row n0 + r, columns 32b..32b+31 of the K tile
        rw = gl.arange(0, 256, layout=gl.SliceLayout(1, LW))
        cw = gl.arange(0, 32, layout=gl.SliceLayout(0, LW))
        w_ptrs = (q_ptr + gl.expand_dims((n0 + rw % 64).to(gl.int64) * K + k_lo + (rw // 64) * 32, 1)
                  + gl.expand_dims(cw, 0))
        wmask = gl.expand_dims(n0 + rw % 64 < N, 1)
        ring_w = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, 256, 32], S32)
        NX: gl.constexpr = 2 if XLOOP else KT  # x tiles held in shared memory
        xq_s = gl.allocate_shared_memory(gl.float8e4nv, [NX, 4 * BLOCK_M, 32], S32)
        codes_s = gl.allocate_shared_memory(gl.int8, [NX, 4 * BLOCK_M], CODES)
        for jp in gl.static_range(STAGES - 1):  # weights: never written by a kernel, so before any wait
            _issue_w(ring_w, w_ptrs, wmask, jp, jp, n_k)
        # weight scales of the accumulator's rows
        rn = n0 + gl.arange(0, 64, layout=gl.SliceLayout(1, ACC))
        s_row = (rn // BN_BLK) * s_cols
        smask = rn < N
        sc = _scale_word(s_ptr, s_row, smask, k_lo, BK_BLK)
        if PDL:
            _grid_dependency(True)
        # x blocks of a tile (grouped weights: this row tile's group of x columns), all KT tiles quantised
        xr = gl.arange(0, 4 * BLOCK_M, layout=gl.SliceLayout(1, LX))
        xc = gl.arange(0, 32, layout=gl.SliceLayout(0, LX))
        x_ptrs = (x_ptr + gl.expand_dims((xr % BLOCK_M).to(gl.int64) * stride_x + (xr // BLOCK_M) * 32, 1)
                  + (n0 // NG).to(gl.int64) * K + k_lo + gl.expand_dims(xc, 0))
        xmask = gl.expand_dims(xr % BLOCK_M < M, 1)
        if XLOOP:
            xq, code = _quantise(gl.load(x_ptrs, mask=xmask, other=0.0).to(gl.float32))
            xq_s.index(0).store(xq)
            codes_s.index(0).store(code.to(gl.int8))
            xv = gl.load(x_ptrs + 128, mask=xmask & (1 < n_k), other=0.0)
        else:
            for t in gl.static_range(KT):
                xv = gl.load(x_ptrs + t * 128, mask=xmask & (t < n_k), other=0.0).to(gl.float32)
                xq, code = _quantise(xv)
                xq_s.index(t).store(xq)
                codes_s.index(t).store(code.to(gl.int8))
        codes_r = _code_rows(codes_s, NX, BLOCK_M)
        total = gl.zeros([64, BLOCK_M], gl.float32, layout=ACC)
        zero = warpgroup_mma_init(gl.zeros([64, BLOCK_M], gl.float32, layout=ACC))
        for i in range(n_k):
            nsc = _scale_word(s_ptr, s_row, smask & (i + 1 < n_k), k_lo + (i + 1) * 128, BK_BLK)
            async_copy.wait_group(STAGES - 2)  # tile i's weights (groups issued: i + STAGES - 1)
            fence_async_shared()
            _cta_barrier()  # every thread's copies (and the x tiles) visible; tile i - 1's wgmma done everywhere
            _issue_w(ring_w, w_ptrs, wmask, i + STAGES - 1, (i + STAGES - 1) % STAGES, n_k)
            wt = ring_w.index(i % STAGES)
            xi = i % 2 if XLOOP else i  # tile i's x slot
            xt = xq_s.index(xi)
            p0 = warpgroup_mma(wt.slice(0, 64), xt.slice(0, BLOCK_M).permute((1, 0)), zero, use_acc=False,
                               is_async=True)
            p1 = warpgroup_mma(wt.slice(64, 64), xt.slice(BLOCK_M, BLOCK_M).permute((1, 0)), zero, use_acc=False,
                               is_async=True)
            p2 = warpgroup_mma(wt.slice(128, 64), xt.slice(2 * BLOCK_M, BLOCK_M).permute((1, 0)), zero,
                               use_acc=False, is_async=True)
            p3 = warpgroup_mma(wt.slice(192, 64), xt.slice(3 * BLOCK_M, BLOCK_M).permute((1, 0)), zero,
                               use_acc=False, is_async=True)
            if XLOOP:  # tile i + 1 into the other slot (its last reader, tile i - 1's wgmma, is done everywhere)
                xq, code = _quantise(xv.to(gl.float32))
                xq_s.index(1 - xi).store(xq)
                codes_s.index(1 - xi).store(code.to(gl.int8))
                xv = gl.load(x_ptrs + (i + 2) * 128, mask=xmask & (i + 2 < n_k), other=0.0)
            p0, p1, p2, p3 = warpgroup_mma_wait(num_outstanding=0, deps=(p0, p1, p2, p3))
            total += p0 * _factor(sc, codes_r.index(4 * xi), 0, ACC)
            total += p1 * _factor(sc, codes_r.index(4 * xi + 1), 8, ACC)
            total += p2 * _factor(sc, codes_r.index(4 * xi + 2), 16, ACC)
            total += p3 * _factor(sc, codes_r.index(4 * xi + 3), 24, ACC)
            sc = nsc
        async_copy.wait_group(0)
        if PDL:
            _grid_dependency(False)  # the next kernel's prologue may overlap this epilogue
        _gemv.store_split(total, rn, pid_n, pid_k, y_ptr, part_ptr, cnt_ptr, M, N, BLOCK_M, SPLIT, ACC)


def takes(x: torch.Tensor, q: torch.Tensor, bn_blk: int, bk_blk: int, e8: bool, ng: int | None = None) -> bool:
    """Whether ``gemm.fp8_block`` of these operands goes here: the knob on, and ``gluon_fp8_gemv.takes`` (Gluon on
    an SM90 device, 1..16 bf16 rows, UE8M0 scales in K blocks of 32s, K % 128 == 0, N and the group % 64 == 0)."""
    return ENABLED and x.shape[0] <= 16 and _gemv.takes(x, q, bn_blk, bk_blk, e8, ng)


KT_MAX = 16  # K tiles a program quantises up front: at most 2048 columns (16 KB of e4m3 x at 8 rows)
RESIDENT = 5  # programs an SM at 8 rows (32 KB ring + <= 16 KB of x): the split's one-wave cap


def launch_plan(m: int, n: int, k: int, sms: int, programs: int | None = None) -> tuple[int, int, int, int]:
    """(64-row tiles, BLOCK_M, K columns a split, splits) of ``gemv_w8a8`` for x [m, k] and q [n, k]: the bf16
    GEMV's split rule (``gluon_fp8_gemv.split_k_tiles``) with this kernel's residency, then halved until a program
    holds at most ``KT_MAX`` tiles of x."""
    tiles = triton.cdiv(n, 64)
    block_m = 8 if m <= 8 else 16
    k_tiles = k // 128
    kt = _gemv.split_k_tiles(tiles, k_tiles, sms, programs or _gemv.WGMMA_GEMV_TUNE["programs"], RESIDENT)
    while kt > KT_MAX:
        kt = -(-kt // 2)
    return tiles, block_m, kt * 128, triton.cdiv(k, kt * 128)


def gemv_w8a8(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, s_cols: int, bn_blk: int, bk_blk: int, sms: int,
              ng: int | None = None, programs: int | None = None, pdl: bool | None = None,
              xloop: bool | None = None, stages: int | None = None) -> torch.Tensor:
    """y [M, N] bf16 = mxfp8(x [M, K]) @ dequant(q [N, K] e4m3, s)^T for M <= 16 (``takes`` must hold); s the UE8M0
    bytes [ceil(N / bn_blk), s_cols] (``s_cols % 4 == 0`` when bk_blk is 32: K % 128 == 0 gives it). Keywords: tuning
    knobs (defaults ``XLOOP``, ``STAGES``)."""
    from deepinfer_nvidia.kernels.triton_fp8_gemv import _counters

    m, (n, k) = x.shape[0], q.shape
    xc = x if x.stride(1) == 1 else x.contiguous()
    s8 = s.view(torch.uint8)
    if bk_blk == 32 and s8.data_ptr() % 4:  # the kernel reads a tile's 4 scale bytes as one int32 word
        s8 = s8.clone()
    tiles, block_m, k_per, split = launch_plan(m, n, k, sms, programs)
    pdl = bool(pdl_launch()) if pdl is None else pdl
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    part = torch.empty(split, m, n, dtype=torch.float32, device=x.device) if split > 1 else y
    cnt = _counters(x.device, tiles) if split > 1 else part
    _w8a8_gemv_kernel[(tiles, split)](xc, q.view(torch.float8_e4m3fn), s8, y, part, cnt, m, n, k,
                                      xc.stride(0), s_cols, ng or n, k_per, BN_BLK=bn_blk, BK_BLK=bk_blk, SPLIT=split,
                                      BLOCK_M=block_m, STAGES=stages or STAGES, KT=k_per // 128, PDL=int(pdl), num_warps=4,
                                      XLOOP=int(XLOOP if xloop is None else xloop),
                                      **({"launch_pdl": True} if pdl else {}))
    return y
