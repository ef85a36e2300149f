"""``gemm.fp8_block`` for 1-16 rows on Hopper's FP8 tensor cores: weight tiles go from TMA straight into ``wgmma``,
and the bf16 activations are split into two e4m3 pieces.

Why (docs/performance.md, twenty-sixth pass). The bf16 swap-AB GEMV (``gluon_fp8_gemv``) turns every weight byte
into bf16 in registers before its ``wgmma``: ~283 SASS instructions a warp for each 64 x 128 tile (Triton 3.6)
plus a cp.async address and three barriers a tile, and one V4.1 layer's FP8 linears take 114 us at one row against
39 us of bytes (twenty-fifth pass). Here no thread touches a weight byte:

1. the e4m3 tile ``[64 rows, 128]`` arrives by TMA (128-byte swizzle, one mbarrier a stage) in a ``STAGES``-deep
   ring, and ``wgmma`` reads it from shared memory as its A operand;
2. per token and 32-column block, ``x = 2^e (h + l)`` with ``e = floor(log2 max|x|) - 7``, ``h = e4m3(x / 2^e)``
   and ``l = e4m3(x / 2^e - h)`` (``split_reference``). ``x / 2^e`` is below 256, so ``h`` never saturates. ``l`` is
   exact wherever ``|x / 2^e| >= 1/4`` (bf16's 8 significant bits leave a residual of <= 4 bits above e4m3's
   smallest step, 2^-9), so an element differs from x by at most ``2^(e - 10)``, i.e. ``max|x| * 2^-17`` of its
   block, and only when it is 2^10 times smaller than the block's largest;
3. per 32-column block ``kb``: ``acc = W_kb h_kb^T + W_kb l_kb^T`` (two m64 nBLOCK_M k32 e4m3 ``wgmma`` from zero,
   the tensor core adds the two pieces; e4m3 x e4m3 products are exact), then on the CUDA cores in fp32
   ``y += acc * (2^e * weight scale)``: the block scales are applied once per 32 columns (the promotion of
   DeepGEMM's FP8 GEMMs), so the tensor core never sums across two scales;
4. split-K partials are summed in split order by the last program of a row tile, as in ``gluon_fp8_gemv``.

Numerics against the reference (``x @ dequant(q, s)^T`` in fp32): the weights are exact (UE8M0 scales are powers
of two); x differs as in 2; the tensor core sums each block's 64 products in its own fp32 accumulation (not IEEE
round-to-nearest per add: ~2^-22 of the block's partial, the reason for the per-block promotion). The device
tests bound the error against the reference and against ``gluon_fp8_gemv``. Not batch-invariant.

SM90 only (``takes``: e4m3 weights, bf16 x, K a multiple of 128, N and groups of 64, UE8M0 scales in blocks of
>= 32). ``DEEPINFER_NV_GEMV_FP8X2=1`` turns it on in place of ``gluon_fp8_gemv`` (off until measured).
"""
from __future__ import annotations

import os

import torch
import triton

from deepinfer_nvidia.kernels import gluon_fp8_gemv as _gemv
from deepinfer_nvidia.kernels.triton_pdl import gluon_grid_dependency, pdl_launch

_GLUON = _gemv.available()
if _GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        warpgroup_mma,
        warpgroup_mma_init,
        warpgroup_mma_wait,
    )

    _cta_barrier = _gemv._cta_barrier
    _tma_load = _gemv._tma_load
    _grid_dependency = gluon_grid_dependency

# on / off, ring depth (8 KB a stage), programs per SM to aim for with split-K and the resident cap (0: none)
# and 128-column tiles a step (1 or 2)
FP8X2_TUNE: dict[str, int] = {"enabled": int(os.environ.get("DEEPINFER_NV_GEMV_FP8X2", "0")), "stages": 4,
                              "programs": 4, "resident": 0, "ksub": 2}


def split_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kernel's split of x ``[M, K]`` (K a multiple of 32) on the host (CPU tests): ``(h, l, scale)`` with h, l
    e4m3 ``[M, K]`` and scale fp32 ``[M, K / 32]`` (powers of two), ``x ~= scale * (h + l)`` per 32-column block."""
    m, k = x.shape
    xb = x.float().reshape(m, k // 32, 32)
    amax = xb.abs().amax(dim=2)
    eb = ((amax.view(torch.int32) >> 23) & 0xFF).clamp(min=8)  # biased exponent of max|x| (>= 8: scale normal)
    inv = ((261 - eb) << 23).view(torch.float32)  # 2^(7 - E)
    v = xb * inv[..., None]
    h = v.to(torch.float8_e4m3fn)
    lo = (v - h.float()).to(torch.float8_e4m3fn)
    return h.reshape(m, k), lo.reshape(m, k), ((eb - 7) << 23).view(torch.float32)


if _GLUON:
    @gluon.jit
    def _pad_rows(t, ROWS: gl.constexpr, BLOCK_M: gl.constexpr):
        """``t [ROWS, 128]`` -> ``[BLOCK_M, 128]`` with rows [ROWS, BLOCK_M) zero (the wgmma's N is at least 8 rows;
        a swizzled shared buffer cannot be stored a few rows at a time), in registers."""
        if ROWS < BLOCK_M:
            t = gl.permute(gl.join(t, gl.zeros_like(t)), (2, 0, 1)).reshape([2 * ROWS, 128])
            t = _pad_rows(t, 2 * ROWS, BLOCK_M)
        return t

    @gluon.jit
    def _split_store(x_ptrs, xmask, h_buf, l_buf, sx_buf, ROWS: gl.constexpr, BLOCK_M: gl.constexpr,
                     LX: gl.constexpr):
        """Load x ``[ROWS, 128]`` bf16 and split it: e4m3 ``h``, ``l`` into rows [0, ROWS) of ``h_buf``, ``l_buf``
        ([BLOCK_M, 128]) and the block scales 2^e (fp32) into columns [0, ROWS) of ``sx_buf`` [4, BLOCK_M]."""
        v = gl.load(x_ptrs, mask=xmask, other=0.0).to(gl.float32).reshape([ROWS, 4, 32])
        amax = gl.max(gl.abs(v), axis=2)  # [ROWS, 4]
        eb = gl.maximum((amax.to(gl.int32, bitcast=True) >> 23) & 0xFF, 8)
        inv = ((261 - eb) << 23).to(gl.float32, bitcast=True)  # 2^(7 - E): x / 2^e below 256
        v = v * gl.expand_dims(inv, 2)
        h = v.to(gl.float8e4nv)
        lo = (v - h.to(gl.float32)).to(gl.float8e4nv)
        h_buf.store(_pad_rows(h.reshape([ROWS, 128]), ROWS, BLOCK_M))
        l_buf.store(_pad_rows(lo.reshape([ROWS, 128]), ROWS, BLOCK_M))
        sx_buf.slice(0, ROWS, 1).store(gl.permute(((eb - 7) << 23).to(gl.float32, bitcast=True), (1, 0)))

    @gluon.jit
    def _weight_scales(s_ptr, s_row, smask, kcol, K, BK_BLK: gl.constexpr, NB: gl.constexpr):
        """The UE8M0 scales of this thread's rows for the ``NB`` 32-column blocks from column ``kcol`` as fp32
        (2^(s-127); s = 0 is the subnormal 2^-127; 1 past column K, where x and the weights are zero): a tuple of
        NB [64] vectors."""
        out = ()
        for kb in gl.static_range(NB):
            s = gl.load(s_ptr + s_row + (kcol + 32 * kb) // BK_BLK, mask=smask & (kcol + 32 * kb < K),
                        other=127).to(gl.int32)
            out = out + (gl.where(s == 0, 0x00400000, s << 23).to(gl.float32, bitcast=True),)
        return out

    @gluon.jit
    def _issue(q_desc, bars, ring0, ring1, n0, kc, j, n_k, STAGES: gl.constexpr, KSUB: gl.constexpr):
        """TMA of step ``j``'s KSUB weight boxes [64, 128] into slot ``j % STAGES`` of ``ring0`` (and ``ring1``: one
        allocation per box, so the compiler sees two disjoint writes) (nothing past ``n_k``)."""
        live = j < n_k
        sj = j % STAGES
        mbarrier.expect(bars.index(sj), KSUB * 64 * 128, pred=live)
        _tma_load(q_desc, [n0, kc + j * KSUB * 128], bars.index(sj), ring0.index(sj), pred=live)
        if KSUB == 2:
            _tma_load(q_desc, [n0, kc + j * KSUB * 128 + 128], bars.index(sj), ring1.index(sj), pred=live)

    @gluon.jit
    def _block_mma(w, hb, lb, zero, accs):
        """The 4 32-column blocks of one 128-column tile: ``W_kb h_kb^T + W_kb l_kb^T`` each from zero, appended to
        the tuple ``accs`` (async: wait for them with ``warpgroup_mma_wait``)."""
        for kb in gl.static_range(4):
            a = warpgroup_mma(w.slice(32 * kb, 32, 1), hb.slice(32 * kb, 32, 1).permute((1, 0)), zero,
                              use_acc=False, is_async=True)
            a = warpgroup_mma(w.slice(32 * kb, 32, 1), lb.slice(32 * kb, 32, 1).permute((1, 0)), a, is_async=True)
            accs = accs + (a,)
        return accs

    @gluon.jit
    def _fp8x2_gemv_kernel(x_ptr, q_desc, s_ptr, y_ptr, part_ptr, cnt_ptr, M, N, K, stride_x, s_cols, NG,
                           k_per_split, BN_BLK: gl.constexpr, BK_BLK: gl.constexpr, SPLIT: gl.constexpr,
                           BLOCK_M: gl.constexpr, ROWS: gl.constexpr, KSUB: gl.constexpr, STAGES: gl.constexpr,
                           PDL: gl.constexpr, num_warps: gl.constexpr):
        """Program (row tile of 64 weight rows, K split): ``y[m, n] = sum_k x[m, k] * q[n, k] * s``. x [M, K] bf16;
        ``q_desc``: TMA descriptor of q [N, K] e4m3 (boxes [64, 128], 128-byte swizzle); s UE8M0 bytes
        [ceil(N / BN_BLK), s_cols]; y [M, N] bf16; part [SPLIT, M, N] fp32 and cnt (zeroed int32 per row tile) when
        SPLIT > 1. NG: rows per weight group (group g reads x columns g*K..(g+1)*K). A step is KSUB 128-column
        tiles; ``k_per_split`` a multiple of 128 * KSUB (K of 128 * KSUB). ``ROWS`` (a power of 2 >= M, <= BLOCK_M)
        rows of x are split; the wgmma's other rows of h and l stay zero. PDL: the first STAGES steps' weight boxes
        (never written by a kernel) are requested before the wait; the next kernel may launch once the K loop is
        done (``gluon_fp8_gemv``'s order)."""
        gl.static_assert(num_warps == 4)
        ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_M, 32])
        # x tiles [ROWS, 128]: ROWS contiguous columns a thread (one 16-byte load at 8 rows), exactly one element each
        WR: gl.constexpr = ROWS if ROWS <= num_warps else num_warps
        LX: gl.constexpr = gl.BlockedLayout([1, ROWS], [ROWS // WR, 32 * WR // ROWS], [WR, num_warps // WR], [1, 0])
        WS: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
        SXL: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        pid_n = gl.program_id(0)
        pid_k = gl.program_id(1)
        n0 = pid_n * 64
        k_lo = pid_k * k_per_split
        n_k = gl.cdiv(gl.minimum(k_per_split, K - k_lo), 128 * KSUB)
        gl.static_assert(KSUB == 1 or KSUB == 2)
        ring0 = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, 64, 128], WS)
        ring1 = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, 64, 128], WS) if KSUB == 2 else ring0
        bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for sb in gl.static_range(STAGES):
            mbarrier.init(bars.index(sb), count=1)
        fence_async_shared()
        _cta_barrier()
        for jp in gl.static_range(STAGES):  # weights first: never written by a kernel, so before the PDL wait
            _issue(q_desc, bars, ring0, ring1, n0, k_lo, jp, n_k, STAGES, KSUB)
        if PDL:
            _grid_dependency(True)
        # the pieces of a step's KSUB tiles, one allocation each (static offsets: the compiler sees them apart),
        # [BLOCK_M, 128] e4m3, and their scales [KSUB, 4, BLOCK_M]. One set: step i + 1 writes them after every
        # warp has waited for step i's wgmma (the barrier below)
        h0 = gl.allocate_shared_memory(gl.float8e4nv, [BLOCK_M, 128], WS)
        l0 = gl.allocate_shared_memory(gl.float8e4nv, [BLOCK_M, 128], WS)
        h1 = gl.allocate_shared_memory(gl.float8e4nv, [BLOCK_M, 128], WS) if KSUB == 2 else h0
        l1 = gl.allocate_shared_memory(gl.float8e4nv, [BLOCK_M, 128], WS) if KSUB == 2 else l0
        sxs = gl.allocate_shared_memory(gl.float32, [KSUB, 4, BLOCK_M], SXL)
        if ROWS < BLOCK_M:  # the scales of x's padding rows: 1, times their zero products
            LZ: gl.constexpr = gl.BlockedLayout([1, 1], [4, 8], [1, num_warps], [1, 0])
            for zb in gl.static_range(KSUB):
                sxs.index(zb).store(gl.full([4, BLOCK_M], 1.0, gl.float32, layout=LZ))
        xm = gl.arange(0, ROWS, layout=gl.SliceLayout(1, LX))
        xk = gl.arange(0, 128, layout=gl.SliceLayout(0, LX))
        # x tile pointers (natural order; grouped weights: this row tile's group of x columns)
        x_ptrs = (x_ptr + gl.expand_dims(xm.to(gl.int64) * stride_x, 1) + (n0 // NG).to(gl.int64) * K + k_lo
                  + gl.expand_dims(xk, 0))
        xmask = gl.expand_dims(xm < M, 1)
        xcol = gl.expand_dims(xk, 0)
        k_len = gl.minimum(k_per_split, K - k_lo)  # this split's columns (a second box may pass K: zeros)
        rs = n0 + gl.arange(0, 64, layout=gl.SliceLayout(1, ACC))
        s_row = (rs // BN_BLK) * s_cols
        smask = rs < N
        sw = _weight_scales(s_ptr, s_row, smask, k_lo, K, BK_BLK, 4 * KSUB)
        y = gl.zeros([64, BLOCK_M], gl.float32, layout=ACC)
        zero = warpgroup_mma_init(gl.zeros([64, BLOCK_M], gl.float32, layout=ACC))
        for i in range(n_k):
            _cta_barrier()  # every warp's wgmma of step i - 1 is done: the pieces may be rewritten
            c0 = i * KSUB * 128
            _split_store(x_ptrs + c0, xmask & (xcol + c0 < k_len), h0, l0, sxs.index(0), ROWS, BLOCK_M, LX)
            if KSUB == 2:
                _split_store(x_ptrs + c0 + 128, xmask & (xcol + c0 + 128 < k_len), h1, l1, sxs.index(1), ROWS,
                             BLOCK_M, LX)
            nsw = _weight_scales(s_ptr, s_row, smask & (i + 1 < n_k), k_lo + (i + 1) * 128 * KSUB, K, BK_BLK,
                                 4 * KSUB)
            fence_async_shared()  # the pieces' generic stores before the tensor core reads them
            _cta_barrier()  # ... by every warp (and step i - 1's ring slot is free)
            if i > 0:  # refill the slot of step i - 1 with step i - 1 + STAGES
                _issue(q_desc, bars, ring0, ring1, n0, k_lo, i - 1 + STAGES, n_k, STAGES, KSUB)
            si = i % STAGES
            mbarrier.wait(bars.index(si), (i // STAGES) & 1)
            accs = _block_mma(ring0.index(si), h0, l0, zero, ())
            if KSUB == 2:
                accs = _block_mma(ring1.index(si), h1, l1, zero, accs)
            accs = warpgroup_mma_wait(num_outstanding=0, deps=accs)
            for ks in gl.static_range(KSUB):
                sx = sxs.index(ks)
                for kb in gl.static_range(4):
                    y += accs[4 * ks + kb] * (gl.expand_dims(sw[4 * ks + kb], 1) * sx.slice(kb, 1, 0).load(ACC))
            sw = nsw
        for sb in gl.static_range(STAGES):  # every issued box has been waited for (only steps < n_k are issued)
            mbarrier.invalidate(bars.index(sb))
        if PDL:
            _grid_dependency(False)  # the next kernel's prologue may overlap this epilogue
        rn = n0 + gl.arange(0, 64, layout=gl.SliceLayout(1, ACC))
        rm = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, ACC))
        offs = gl.expand_dims(rm.to(gl.int64) * N, 0) + gl.expand_dims(rn, 1)
        omask = gl.expand_dims(rm < M, 0) & gl.expand_dims(rn < N, 1)
        if SPLIT == 1:
            gl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=omask)
        else:
            gl.store(part_ptr + pid_k.to(gl.int64) * M * N + offs, y, mask=omask)
            _cta_barrier()
            if gl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel") == SPLIT - 1:
                total = gl.zeros([64, BLOCK_M], gl.float32, layout=ACC)
                for sk in range(SPLIT):
                    total += gl.load(part_ptr + sk * M * N + offs, mask=omask, other=0.0, cache_modifier=".cg")
                gl.store(y_ptr + offs, total.to(y_ptr.dtype.element_ty), mask=omask)
                gl.atomic_xchg(cnt_ptr + pid_n, 0)


def takes(x: torch.Tensor, q: torch.Tensor, bn_blk: int, bk_blk: int, e8: bool, ng: int | None = None) -> bool:
    """Whether ``gemm.fp8_block`` of these operands goes here: switched on, ``gluon_fp8_gemv.takes``, e4m3 weights
    (float8 or their bytes) that TMA can describe (contiguous, 16-byte aligned)."""
    return (bool(FP8X2_TUNE["enabled"]) and _gemv.takes(x, q, bn_blk, bk_blk, e8, ng) and q.element_size() == 1
            and q.is_contiguous() and q.data_ptr() % 16 == 0)


def weight_desc(q: torch.Tensor):
    """TMA descriptor of e4m3 ``q [N, K]``, boxes [64, 128] in the 128-byte swizzle ``wgmma`` reads (made per call:
    a descriptor holds its tensor, see ``gluon_fp8_gemv.weight_desc``)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    layout = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    return TensorDescriptor.from_tensor(q.view(torch.float8_e4m3fn), [64, 128], layout)


def gemv_fp8x2(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, s_cols: int, bn_blk: int, bk_blk: int, sms: int,
               ng: int | None = None, stages: int | None = None, programs: int | None = None,
               resident: int | None = None, pdl: bool | None = None, ksub: int | None = None) -> torch.Tensor:
    """y [M, N] bf16 = x [M, K] @ dequant(q [N, K] e4m3, s)^T for M <= 16 (``takes`` must hold but for the switch);
    s the UE8M0 bytes [ceil(N / bn_blk), s_cols]. Keyword arguments: tuning knobs (defaults ``FP8X2_TUNE``)."""
    from deepinfer_nvidia.kernels.triton_fp8_gemv import _counters

    m, (n, k) = x.shape[0], q.shape
    tune = FP8X2_TUNE
    xc = x if x.stride(1) == 1 else x.contiguous()
    tiles = triton.cdiv(n, 64)
    ksub = ksub or tune["ksub"]
    per_tiles = _gemv.split_k_tiles(tiles, k // 128, sms, programs or tune["programs"],
                                    tune["resident"] if resident is None else resident)
    k_per = triton.cdiv(per_tiles, ksub) * ksub * 128  # whole steps: a step never crosses into the next split
    split = triton.cdiv(k, k_per)
    block_m = 8 if m <= 8 else 16
    pdl = bool(pdl_launch()) if pdl is None else pdl
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    part = torch.empty(split, m, n, dtype=torch.float32, device=x.device) if split > 1 else y
    cnt = _counters(x.device, tiles) if split > 1 else part
    _fp8x2_gemv_kernel[(tiles, split)](xc, weight_desc(q), s.view(torch.uint8), y, part, cnt, m, n, k, xc.stride(0),
                                       s_cols, ng or n, k_per, BN_BLK=bn_blk, BK_BLK=bk_blk, SPLIT=split,
                                       BLOCK_M=block_m, ROWS=min(block_m, triton.next_power_of_2(m)), KSUB=ksub,
                                       STAGES=stages or tune["stages"], PDL=int(pdl), num_warps=4,
                                       **({"launch_pdl": True} if pdl else {}))
    return y
