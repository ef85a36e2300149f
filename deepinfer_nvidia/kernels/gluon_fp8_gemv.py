"""``gemm.fp8_block`` for 1-16 rows (1-32 with ``DEEPINFER_NV_WGMMA_GEMV_ROWS=32``) on Hopper: a swap-AB ``wgmma``
GEMV written in Gluon.

Why (docs/performance.md, twelfth pass). The CUDA-core GEMV (``triton_fp8_gemv``) spends ~6 instructions per
weight byte at V4.1's [32, 32] scale blocks (byte shuffles, e4m3 -> f16 -> f32, one FMA per element), and at
batch 1 its 70 calls per 8-layer step take 28% of the GPU time at ~1.4 TB/s. Here the weight rows are the MMA's
M (64 per program) and the 1-16 activation rows its N, so the tensor core does the multiply-adds and each
thread only turns its bytes into its own ``wgmma`` A fragment:

1. the e4m3 tile ``[64 rows, 128]`` arrives by 16-byte ``cp.async`` into a ``STAGES``-deep ring (the
   activation tile ``[BLOCK_M, 128]`` beside it);
2. each thread reads back the 32 bytes per row of its fragment (rows 16w+r and 16w+r+8, bytes 32c..32c+31:
   one [32]-wide scale group) and decodes each 4-byte word by inline PTX into two bf16x2 registers: a byte
   permute, then the e4m3 bits placed on the bf16 exponent/mantissa boundary give ``E4M3 * 2^-120`` exactly
   (subnormals included), and one ``mul.bf16x2`` by ``scale * 2^120`` (exact while the UE8M0 byte is <= 134;
   ``SAFE`` multiplies twice, by ``2^120`` then by the scale);
3. word j of thread c's 32 bytes (physical bytes 32c + 4j .. +3) is the fragment's k-step j: logical K
   16j + 2c + {0, 1} and 16j + 8 + 2c + {0, 1}. The activation tile is gathered in that order by 4-byte
   ``cp.async`` copies (``permute_x`` is the host-side model of that order, for the CPU tests), so no extra
   launch permutes x.

Numerics: every weight becomes ``bf16(q * scale)`` exactly (the reference's rounding; UE8M0 scales make it
exact), the products are exact in fp32 and the tensor core sums them in fp32. Split-K partials are summed in
split order by the last program of each row tile to arrive (``cnt``), so the result does not depend on
timing. Not batch-invariant (the row count picks the path): the ``triton_bi`` provider keeps its own tiling.

SM90 only; where Gluon or the shapes do not fit (``takes``), ``triton_gemm`` keeps its other kernels.
e4m3's NaN code (0x7F / 0xFF) decodes to 480 * scale here; checkpoints hold no NaN weights.
"""
from __future__ import annotations

import os

import torch
import triton

from deepinfer_nvidia.kernels import gluon_moe_swap as _swap, gluon_swap_layout as _layout, scale_checks
from deepinfer_nvidia.kernels import l2_prefetch as _l2
from deepinfer_nvidia.kernels.l2_prefetch import prefetch_asm
from deepinfer_nvidia.kernels.mxfp4_word_decode import _bf16x2_mul
from deepinfer_nvidia.kernels.triton_pdl import gluon_grid_dependency, pdl_launch

_GLUON = _swap.available()
if _GLUON:
    from deepinfer_nvidia.kernels.gluon_api import (
        async_copy,
        cp_async as _cp_async,
        cta_barrier as _cta_barrier,
        fence_async_shared,
        gl,
        gluon,
        mbarrier,
        tma_load as _tma_load,
        warpgroup_mma,
        warpgroup_mma_init,
        warpgroup_mma_wait,
    )
    _grid_dependency = gluon_grid_dependency

# rows served (1..max_rows), stages of the cp.async ring, programs per SM to aim for with split-K, and whether
# the path is on (``DEEPINFER_NV_WGMMA_GEMV=0`` turns it off, for A/B runs). Programmatic dependent launch:
# ``triton_pdl.pdl_launch`` (``_common.PDL``).
# ``resident``: programs of the 3-stage ring that fit on an SM at once (30.7 KB of shared memory, 71 registers: 7);
# when > 0 the split is halved until the launch fits in one wave of them (0: no cap; ``split_k_tiles``).
# ``max_rows`` 32 (``DEEPINFER_NV_WGMMA_GEMV_ROWS=32``; H200, twenty-eighth pass: correct, but the V4 batch-32 step
# took 2.68 ms pipelined against 2.66 at 16, 2.99 graphed against 2.78, so the default stays 16): 17-32
# rows take the kernel with 32 activation rows as the wgmma's N instead of the general FP8 GEMM (which reached ~20%
# of the copy bandwidth in the V4 batch-32 step, pass26g); 48 KB of shared memory a program at 3 stages, so the
# one-wave cap is ``RESIDENT_32`` programs an SM there.
WGMMA_GEMV_TUNE: dict[str, int] = {"max_rows": int(os.environ.get("DEEPINFER_NV_WGMMA_GEMV_ROWS", "16")), "stages": 3,
                                   "programs": 4, "resident": 7,
                                   "enabled": int(os.environ.get("DEEPINFER_NV_WGMMA_GEMV", "1"))}
if WGMMA_GEMV_TUNE["max_rows"] not in (16, 32):
    raise ValueError(f"DEEPINFER_NV_WGMMA_GEMV_ROWS must be 16 or 32, got {WGMMA_GEMV_TUNE['max_rows']}")
RESIDENT_32 = 4
# Weight tiles by TMA ([64 rows, 128 bytes] boxes, one mbarrier a stage) instead of 128 threads' cp.async:
# bit-equal on the H200, slower (a V4.1 layer's GEMVs in rings 133 -> 142 us at one row: docs/performance.md,
# twentieth pass), so off.
GEMV_TMA = False
# The cp.async ring's weight tile as [64 rows, 128 bytes] with its 16-byte chunks XOR-swizzled by row % 8, instead of
# unswizzled rows. Each fragment read (LDS.128) of a quarter-warp covers two rows at the same 4 chunk offsets, and
# 128-byte rows put both on the same 16 banks: two wavefronts where one would do (ncu's source view of wq_b at one
# row: the 4 LDS.128 of the loop are all of the launch's excess shared wavefronts, 50% of their total; the
# decode's first instruction waits on them: 11% of the stall samples; docs/performance.md, twenty-third pass). The
# copies stay 16-byte and the bytes read are the same (bit-equal by construction). ``DEEPINFER_NV_GEMV_SWIZZLE=0``:
# the unswizzled ring. The TMA path keeps its unswizzled boxes.
GEMV_SWIZZLE = os.environ.get("DEEPINFER_NV_GEMV_SWIZZLE", "1") == "1"
# Under PDL, let the next kernel launch right after this one's ``griddepcontrol.wait`` (kernel ``PDL=2``) instead of
# after its K loop (``PDL=1``, the eighteenth pass's choice, made when the GEMV was the only PDL kernel). Every
# kernel of the chain waits before it reads or writes, so the order is the same; what changes is that a following
# wgmma GEMV (wo_a -> wo_b, wq_a -> wkv when apart) requests its first weight tiles while this one's whole K loop
# runs, not only its epilogue. Its programs then hold ~31 KB of shared memory on SMs this launch already fills
# (every program of this launch is resident before the release can fire). Measured no faster on the H200, so opt-in
# (``DEEPINFER_NV_GEMV_EARLY_RELEASE=1``; V4.1 batch 1 2.48 -> 2.53 and 2.36 -> 2.36 ms: docs/performance.md,
# thirty-third pass).
GEMV_EARLY_RELEASE = os.environ.get("DEEPINFER_NV_GEMV_EARLY_RELEASE", "0") == "1"
# K tiles ahead of the one being decoded that a program asks L2 for (``l2_prefetch``): tiles STAGES-1 .. PREFETCH-1
# in the prologue (before the wait under PDL, so they stream while the previous kernel runs), tile i + PREFETCH
# in iteration i. ``GEMV_L2_BUDGET``: bytes of L2 the launch's prefetched-but-unread tiles may hold at once
# (programs x (PREFETCH - STAGES + 1) x 8 KB); the distance is cut to fit. 0 (the default): off. Measured slower on
# an H100 (a V4.1 layer's GEMVs at one row 88.6 -> 95.8 us by lines; docs/performance.md, thirty-fourth pass).
# ``DEEPINFER_NV_GEMV_L2_PREFETCH``.
GEMV_L2_PREFETCH = int(os.environ.get("DEEPINFER_NV_GEMV_L2_PREFETCH", "0"))
GEMV_L2_BUDGET = 24 << 20
_SM90: dict[int, bool] = {}  # device index -> capability 9.x (asked once per device)


def _sm90(device: torch.device) -> bool:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM90:
        _SM90[idx] = torch.cuda.get_device_capability(idx)[0] == 9
    return _SM90[idx]


def _word_asm(safe: bool) -> str:
    """4 e4m3 bytes (b0..b3 of word $2) -> $0 = bf16x2 (b0, b1), $1 = (b2, b3), times the scale pair $3.
    prmt puts b1 at byte 2 and b2 at byte 1, then each half-word's low byte lands on bf16 bits 4-10 (magnitude)
    and 15 (sign): E4M3 * 2^-120 exactly."""
    scale0 = "mul.rn.bf16x2 a, a, c; mul.rn.bf16x2 $0, a, $3; " if safe else "mul.rn.bf16x2 $0, a, $3; "
    scale1 = "mul.rn.bf16x2 a, a, c; mul.rn.bf16x2 $1, a, $3; " if safe else "mul.rn.bf16x2 $1, a, $3; "
    return ("{ .reg .b32 w, a, b, c; mov.b32 c, 0x7B807B80; prmt.b32 w, $2, 0, 0x3120; "
            "shl.b32 a, w, 4; shl.b32 b, w, 8; and.b32 b, b, 0x80008000; lop3.b32 a, a, 0x07F007F0, b, 0xEA; "
            + scale0 +
            "shr.b32 a, w, 4; and.b32 b, w, 0x80008000; lop3.b32 a, a, 0x07F007F0, b, 0xEA; "
            + scale1 + "}")


def decode_word_reference(word: int, scale_bits: int, safe: bool = True) -> list[int]:
    """Pure-Python model of ``_word_asm`` on one 32-bit word (CPU tests): its 2 output registers.
    ``scale_bits``: the bf16x2 scale operand (2^(s-127), or 2^(s-7) when not ``safe``)."""
    b = [(word >> (8 * i)) & 0xFF for i in range(4)]
    w = b[0] | (b[2] << 8) | (b[1] << 16) | (b[3] << 24)  # prmt 0x3120
    a0 = ((w << 4) & 0x07F007F0) | ((w << 8) & 0x80008000)
    a1 = ((w >> 4) & 0x07F007F0) | (w & 0x80008000)
    mul = _bf16x2_mul
    return [mul(mul(a, 0x7B807B80), scale_bits) if safe else mul(a, scale_bits) for a in (a0, a1)]


def available() -> bool:
    return _GLUON


def permute_x(x: torch.Tensor) -> torch.Tensor:
    """Activations ``[M, K]`` (K a multiple of 128) in the kernel's K order (a copy; the kernel gathers the same
    order itself): per 128 columns, logical 16j + 8h + 2c + e holds physical 32c + 4j + 2h + e."""
    m, k = x.shape
    return x.reshape(m, k // 128, 4, 8, 2, 2).permute(0, 1, 3, 4, 2, 5).reshape(m, k)


if _GLUON:
    def _fragment_bytes_layout():
        """[64, 4, 32] bytes of a 128-column e4m3 tile: warp w, lane (r = lane // 4, c = lane % 4) holds rows
        16w + r and 16w + r + 8, bytes 32c..32c+31 (its wgmma A fragment's rows and K columns)."""
        return gl.DistributedLinearLayout(
            reg_bases=[[0, 0, 1], [0, 0, 2], [0, 0, 4], [0, 0, 8], [0, 0, 16], [8, 0, 0]],
            lane_bases=[[0, 1, 0], [0, 2, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
            warp_bases=[[16, 0, 0], [32, 0, 0]], block_bases=[], shape=[64, 4, 32])

    def _fragment_rows_layout():
        """``_fragment_bytes_layout`` on the tile viewed as [64 rows, 128 bytes] (byte 32c + b of a row)."""
        return gl.DistributedLinearLayout(
            reg_bases=[[0, 1], [0, 2], [0, 4], [0, 8], [0, 16], [8, 0]],
            lane_bases=[[0, 32], [0, 64], [1, 0], [2, 0], [4, 0]],
            warp_bases=[[16, 0], [32, 0]], block_bases=[], shape=[64, 128])

    _FRAG = gl.constexpr(_fragment_bytes_layout())
    _FRAG2D = gl.constexpr(_fragment_rows_layout())
    _ASM_SAFE = gl.constexpr(_word_asm(True))
    _ASM_FAST = gl.constexpr(_word_asm(False))
    _PF64 = gl.constexpr(prefetch_asm(64))
    _PF_LINE = gl.constexpr(prefetch_asm(0))

    @gluon.jit
    def _decode(b, sc, SAFE: gl.constexpr):
        """``b [64, 4, 32]`` e4m3 bytes, ``sc [64, 4, 1]`` UE8M0 -> ``[64, 128]`` bf16 in the fragment's K order
        (logical 16j + 8h + 2c + e = the byte 32c + 4j + 2h + e)."""
        s16 = sc.to(gl.int16)
        if SAFE:  # 2^(s-127) as bf16 bits (s = 0: the subnormal 2^-127)
            bits = gl.where(s16 == 0, 64, s16 << 7)
            asm: gl.constexpr = _ASM_SAFE
        else:  # 2^(s-7) = scale * 2^120, a normal bf16 for s <= 134 (checked by the wrapper)
            bits = (s16 + 120) << 7
            asm: gl.constexpr = _ASM_FAST
        scale = gl.broadcast(bits.to(gl.bfloat16, bitcast=True), b)[0]
        d = gl.inline_asm_elementwise(asm, "=r,=r,r,r,r", [b, scale], dtype=gl.bfloat16, is_pure=True, pack=4)
        # d[row, c, 4j + 2h + e] -> logical 16j + 8h + 2c + e
        return d.reshape([64, 4, 8, 2, 2]).permute(0, 2, 3, 1, 4).reshape([64, 128])

    @gluon.jit
    def _x_column(lk):
        """Logical K column lk = 16j + 8h + 2c + e of a 128-column tile -> the x column it reads,
        32c + 4j + 2h + e (``permute_x``'s order; plain arithmetic, so the CPU tests call it on a tensor)."""
        return 32 * ((lk // 2) % 4) + 4 * (lk // 16) + 2 * ((lk // 8) % 2) + lk % 2

    @gluon.jit
    def _issue(ring_w, ring_x, w_ptrs, x_ptrs, wmask, xmask, j, stage, n_k):
        """cp.async of K tile ``j`` (masked to zero past this program's range) into ring slot ``stage``."""
        live = j < n_k
        _cp_async(ring_w.index(stage), w_ptrs + j * 128, mask=wmask & live)
        _cp_async(ring_x.index(stage), x_ptrs + j * 128, mask=xmask & live)
        async_copy.commit_group()

    @gluon.jit
    def _issue_tma(ring_w, ring_x, q_desc, bars, x_ptrs, xmask, n0, kc0, j, stage, n_k):
        """``_issue`` with the weight tile by TMA (box [64, 4, 32] at row ``n0``, 32-byte column ``kc0 + 4j``) onto
        the stage's mbarrier; nothing is issued for tiles past this program's range."""
        live = j < n_k
        bar = bars.index(stage)
        mbarrier.expect(bar, 64 * 128, pred=live)
        _tma_load(q_desc, [n0, kc0 + j * 4, 0], bar, ring_w.index(stage), pred=live)
        _cp_async(ring_x.index(stage), x_ptrs + j * 128, mask=xmask & live)
        async_copy.commit_group()

    @gluon.jit
    def _l2_prefetch_tile(pf_row, pf_on, j, n_k, LINE: gl.constexpr):
        """Ask L2 for K tile ``j`` of this program's 64 weight rows (nothing past ``n_k``; no shared memory, no
        register result: the ring's later ``cp.async`` of the tile then hits L2). ``pf_row`` [128]: each thread's
        byte address of tile 0, ``pf_on`` whether it asks (``_l2_prefetch_rows``). LINE: the row's 128-byte line by
        ``prefetch.global.L2``, else its 64 bytes by ``cp.async.bulk.prefetch.L2``."""
        live = (pf_on * 0 + j) < n_k
        if LINE:
            asm: gl.constexpr = _PF_LINE
        else:
            asm: gl.constexpr = _PF64
        gl.inline_asm_elementwise(asm, "=r,l,r", [pf_row + j * 128, (live & (pf_on != 0)).to(gl.int32)],
                                  dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def _l2_prefetch_rows(q_ptr, n0, K, k_lo, LINE: gl.constexpr, num_warps: gl.constexpr):
        """[128] byte pointers, thread t: weight row ``n0 + t % 64`` at column ``k_lo + 64 * (t // 64)``; and [128]
        int32, 1 where the thread asks (LINE: the first 64, one line a row; else all, 64 bytes each)."""
        LP: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
        t = gl.arange(0, 128, layout=LP)
        on = (t < 64).to(gl.int32) if LINE else t * 0 + 1
        return q_ptr + (n0 + t % 64).to(gl.int64) * K + k_lo + 64 * (t // 64), on

    @gluon.jit
    def _wgmma_gemv_kernel(x_ptr, q_ptr, s_ptr, y_ptr, part_ptr, cnt_ptr, M, N, K, stride_x, s_cols, NG, k_per_split,
                           BN_BLK: gl.constexpr, BK_BLK: gl.constexpr, SPLIT: gl.constexpr, BLOCK_M: gl.constexpr,
                           STAGES: gl.constexpr, SAFE: gl.constexpr, PDL: gl.constexpr, TMA: gl.constexpr, q_desc,
                           num_warps: gl.constexpr, SWIZZLE: gl.constexpr = 0, PREFETCH: gl.constexpr = 0,
                           PF_LINE: gl.constexpr = 1):
        """Program (row tile of 64 weight rows, K split): ``y[m, n] = sum_k x[m, k] * bf16(q[n, k] * s)``.
        x [M, K] bf16 (natural order: the tile loads gather ``permute_x``'s order); q [N, K] e4m3 bytes; s UE8M0 bytes
        [ceil(N / BN_BLK), s_cols]; y [M, N] bf16; part [SPLIT, M, N] fp32 and cnt (zeroed int32 per row tile)
        when SPLIT > 1. NG: rows per weight group (grouped op: group g reads x columns g*K..(g+1)*K).
        PDL (launched with programmatic dependent launch): the first weight tiles and their scales (never written
        by a kernel) are requested before waiting for the previous kernel, x and every store after it; the next
        kernel may launch once the K loop is done (PDL 1) or right after the wait (PDL 2). TMA: the weight tiles arrive by TMA (``q_desc``: q viewed as
        [N, K/32, 32] bytes, boxes [64, 4, 32]) into the same unswizzled bytes, x keeps ``cp.async``. SWIZZLE (not
        with TMA): the ring holds [64, 128] byte tiles whose 16-byte chunks are XOR-swizzled by row % 8
        (``GEMV_SWIZZLE``), so a quarter-warp's fragment read touches all 32 banks once. PREFETCH (> STAGES - 1):
        weight tiles up to PREFETCH - 1 are asked of L2 in the prologue (before the wait, under PDL) and tile
        i + PREFETCH in iteration i, so each tile's ``cp.async`` finds it in L2 (``GEMV_L2_PREFETCH``); PF_LINE: by
        lines, else bulk requests (``l2_prefetch.LINE``)."""
        gl.static_assert(num_warps == 4)
        LW: gl.constexpr = gl.BlockedLayout([1, 1, 16], [4, 4, 2], [num_warps, 1, 1], [2, 1, 0])
        LX: gl.constexpr = gl.BlockedLayout([1, 2], [1, 32], [num_warps, 1], [1, 0])  # 4-byte gathers of x
        LS: gl.constexpr = gl.SliceLayout(2, _FRAG)
        ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_M, 16])
        AOP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=ACC, k_width=2)
        SX: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        RING: gl.constexpr = gl.SwizzledSharedLayout(16, 1, 1, [2, 1, 0])
        pid_n = gl.program_id(0)
        pid_k = gl.program_id(1)
        n0 = pid_n * 64
        k_lo = pid_k * k_per_split
        n_k = gl.cdiv(gl.minimum(k_per_split, K - k_lo), 128)
        # weight tile pointers [64, 4, 32] (16 contiguous bytes per thread and copy)
        rw = n0 + gl.arange(0, 64, layout=gl.SliceLayout(1, gl.SliceLayout(2, LW)))
        cw = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(2, LW)))
        bw = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(1, LW)))
        if SWIZZLE:  # the same copies over [64, 128] (the ring's 2-D view)
            LW2: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [num_warps, 1], [1, 0])
            rw2 = n0 + gl.arange(0, 64, layout=gl.SliceLayout(1, LW2))
            cw2 = gl.arange(0, 128, layout=gl.SliceLayout(0, LW2))
            w_ptrs = q_ptr + gl.expand_dims(rw2.to(gl.int64) * K + k_lo, 1) + gl.expand_dims(cw2, 0)
            wmask = gl.expand_dims(rw2 < N, 1)
        else:
            w_ptrs = (q_ptr + gl.expand_dims(gl.expand_dims(rw.to(gl.int64) * K + k_lo, 1), 2)
                      + gl.expand_dims(gl.expand_dims(cw * 32, 0), 2) + gl.expand_dims(gl.expand_dims(bw, 0), 1))
            wmask = gl.expand_dims(gl.expand_dims(rw < N, 1), 2)
        # activation tile pointers [BLOCK_M, 128] in the fragment's K order (``permute_x``): logical column
        # 16j + 8h + 2c + e reads x column 32c + 4j + 2h + e, so each pair (e) is 4 contiguous bytes (grouped
        # weights: this row tile's group of x columns)
        xm = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, LX))
        lk = gl.arange(0, 128, layout=gl.SliceLayout(0, LX))
        xk = _x_column(lk)
        x_ptrs = (x_ptr + gl.expand_dims(xm.to(gl.int64) * stride_x, 1) + (n0 // NG).to(gl.int64) * K + k_lo
                  + gl.expand_dims(xk, 0))
        xmask = gl.expand_dims(xm < M, 1)
        # scale rows of this thread's fragment rows, [64, 4] (c: its 32-byte group of the tile)
        rs = n0 + gl.arange(0, 64, layout=gl.SliceLayout(1, LS))
        cs = gl.arange(0, 4, layout=gl.SliceLayout(0, LS))
        s_row = gl.expand_dims((rs // BN_BLK) * s_cols, 1)  # constexpr blocks: shifts, not divisions
        s_col = k_lo + gl.expand_dims(cs * 32, 0)
        smask = gl.expand_dims(rs < N, 1)

        gl.static_assert(not (SWIZZLE and TMA))
        if TMA:  # the bytes of RING (row-major, unswizzled), written by the TMA unit
            WRING: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=3)
            ring_w = gl.allocate_shared_memory(gl.uint8, [STAGES, 64, 4, 32], WRING)
        elif SWIZZLE:  # 16-byte chunk c of row r stored at chunk c ^ (r % 8)
            WRING2: gl.constexpr = gl.SwizzledSharedLayout(16, 1, 8, [1, 0])
            ring_w = gl.allocate_shared_memory(gl.uint8, [STAGES, 64, 128], WRING2)
        else:
            ring_w = gl.allocate_shared_memory(gl.uint8, [STAGES, 64, 4, 32], RING)
        ring_x = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_M, 128], SX)
        acc = warpgroup_mma_init(gl.zeros([64, BLOCK_M], gl.float32, layout=ACC))
        kc0 = k_lo // 32  # this split's first 32-byte column of q
        if PREFETCH:  # weights only: never written by a kernel, so asked for before any wait
            gl.static_assert(PREFETCH > STAGES - 1)
            pf_row, pf_on = _l2_prefetch_rows(q_ptr, n0, K, k_lo, PF_LINE, num_warps)
            for jp in gl.static_range(STAGES - 1, PREFETCH):
                _l2_prefetch_tile(pf_row, pf_on, jp, n_k, PF_LINE)
        if TMA:
            bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
            for sb in gl.static_range(STAGES):
                mbarrier.init(bars.index(sb), count=1)
            fence_async_shared()
            _cta_barrier()
        if PDL:
            # weights first, then the wait, then x: commit groups of the prologue are (W0..W{S-2}, X0), (X1), ...,
            # so the loop's wait_group(STAGES - 1) still covers tile i's weights and activations
            for jp in gl.static_range(STAGES - 1):
                if TMA:
                    mbarrier.expect(bars.index(jp), 64 * 128, pred=jp < n_k)
                    _tma_load(q_desc, [n0, kc0 + jp * 4, 0], bars.index(jp), ring_w.index(jp), pred=jp < n_k)
                else:
                    _cp_async(ring_w.index(jp), w_ptrs + jp * 128, mask=wmask & (jp < n_k))
            _grid_dependency(True)
            if PDL == 2:  # release the next kernel now (``GEMV_EARLY_RELEASE``)
                _grid_dependency(False)
            for jp in gl.static_range(STAGES - 1):
                _cp_async(ring_x.index(jp), x_ptrs + jp * 128, mask=xmask & (jp < n_k))
                async_copy.commit_group()
        else:
            for jp in gl.static_range(STAGES - 1):
                if TMA:
                    _issue_tma(ring_w, ring_x, q_desc, bars, x_ptrs, xmask, n0, kc0, jp, jp, n_k)
                else:
                    _issue(ring_w, ring_x, w_ptrs, x_ptrs, wmask, xmask, jp, jp, n_k)
        sc = gl.expand_dims(gl.load(s_ptr + s_row + s_col // BK_BLK, mask=smask, other=127), 2)
        for i in range(n_k):
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            _cta_barrier()  # every warp's wgmma of tile i-1 is done: its ring slot may be refilled
            j = i + STAGES - 1
            if TMA:
                fence_async_shared()  # the slot's generic-proxy reads (the last decode) before the TMA rewrites it
                _issue_tma(ring_w, ring_x, q_desc, bars, x_ptrs, xmask, n0, kc0, j, j % STAGES, n_k)
            else:
                _issue(ring_w, ring_x, w_ptrs, x_ptrs, wmask, xmask, j, j % STAGES, n_k)
            if PREFETCH:
                _l2_prefetch_tile(pf_row, pf_on, i + PREFETCH, n_k, PF_LINE)
            nsc = gl.expand_dims(gl.load(s_ptr + s_row + (s_col + (i + 1) * 128) // BK_BLK,
                                         mask=smask & (i + 1 < n_k), other=127), 2)
            async_copy.wait_group(STAGES - 1)
            si = i % STAGES
            if TMA:  # tile i's weight box: the stage's barrier completes once per use of the stage
                mbarrier.wait(bars.index(si), (i // STAGES) & 1)
            fence_async_shared()
            _cta_barrier()
            if SWIZZLE:  # the same bytes per thread, read from the swizzled rows
                wb = gl.convert_layout(ring_w.index(si).load(_FRAG2D).reshape([64, 4, 32]), _FRAG)
            else:
                wb = ring_w.index(si).load(_FRAG)
            a = gl.convert_layout(_decode(wb, sc, SAFE), AOP)
            acc = warpgroup_mma(a, ring_x.index(si).permute((1, 0)), acc, is_async=True)
            sc = nsc
        async_copy.wait_group(0)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        if TMA:  # every issued box has been waited for (only tiles < n_k are issued)
            for sb in gl.static_range(STAGES):
                mbarrier.invalidate(bars.index(sb))
        if PDL == 1:
            _grid_dependency(False)  # the next kernel's prologue may overlap this epilogue
        rn = n0 + gl.arange(0, 64, layout=gl.SliceLayout(1, ACC))
        store_split(acc, rn, pid_n, pid_k, y_ptr, part_ptr, cnt_ptr, M, N, BLOCK_M, SPLIT, ACC)

    @gluon.jit
    def store_split(acc, rn, pid_n, pid_k, y_ptr, part_ptr, cnt_ptr, M, N, BLOCK_M: gl.constexpr, SPLIT: gl.constexpr,
                    ACC: gl.constexpr):
        """The swap-AB GEMVs' epilogue: ``acc`` [64, BLOCK_M] fp32 (weight rows ``rn``, activation rows 0..) into
        y [M, N] bf16, or with SPLIT > 1 into part [SPLIT, M, N] fp32, after which the last program of the row tile
        ``pid_n`` to arrive (``cnt_ptr``) sums all partials in split order and resets the counter (the next launch,
        or graph replay, starts at zero). Shared with ``gluon_w8a8_gemv``."""
        rm = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, ACC))
        offs = gl.expand_dims(rm.to(gl.int64) * N, 0) + gl.expand_dims(rn, 1)
        omask = gl.expand_dims(rm < M, 0) & gl.expand_dims(rn < N, 1)
        if SPLIT == 1:
            gl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=omask)
        else:
            gl.store(part_ptr + pid_k.to(gl.int64) * M * N + offs, acc, mask=omask)
            _cta_barrier()
            if gl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel") == SPLIT - 1:
                total = gl.zeros([64, BLOCK_M], gl.float32, layout=ACC)
                for sk in range(SPLIT):
                    total += gl.load(part_ptr + sk * M * N + offs, mask=omask, other=0.0, cache_modifier=".cg")
                gl.store(y_ptr + offs, total.to(y_ptr.dtype.element_ty), mask=omask)
                gl.atomic_xchg(cnt_ptr + pid_n, 0)


def takes(x: torch.Tensor, q: torch.Tensor, bn_blk: int, bk_blk: int, e8: bool, ng: int | None = None) -> bool:
    """Whether ``gemm.fp8_block`` of these operands goes here: Gluon on an SM90 device, 1..max_rows bf16 rows,
    UE8M0 scales whose K blocks are multiples of 32, K a multiple of 128, N (and the group) of 64."""
    m, (n, k) = x.shape[0], q.shape
    return (_GLUON and bool(WGMMA_GEMV_TUNE["enabled"]) and x.is_cuda and x.dtype == torch.bfloat16 and e8
            and 0 < m <= WGMMA_GEMV_TUNE["max_rows"] and k % 128 == 0 and n % 64 == 0 and bk_blk % 32 == 0
            and (ng is None or ng % 64 == 0) and _sm90(x.device))


def scales_allow_fast(s: torch.Tensor) -> bool:
    """True when every UE8M0 byte is <= 134 (``scale * 2^120`` is then a normal bf16); cached per stack as
    ``scale_checks.scales_allow_fast`` does (graph capture of an unseen stack answers False)."""
    return scale_checks.scales_allow_fast(s, limit=134)


def tma_fits(q: torch.Tensor) -> bool:
    """Whether e4m3 bytes ``q [N, K]`` can be described for the TMA weight tiles: contiguous, 16-byte aligned,
    K a multiple of 32 (rows past N are zero-filled by the TMA unit)."""
    return q.dim() == 2 and q.is_contiguous() and q.shape[1] % 32 == 0 and q.data_ptr() % 16 == 0


def weight_desc(q: torch.Tensor):
    """The TMA descriptor of ``q [N, K]`` bytes viewed as [N, K/32, 32], boxes [64, 4, 32] (one K tile of 64 rows).
    Made per call (~6 us of host time on a CI core; nothing at graph replay). Not cached: a descriptor holds its
    tensor, and a cache would keep freed weights alive."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    n, k = q.shape
    return TensorDescriptor.from_tensor(q.view(n, k // 32, 32), [64, 4, 32], _layout.weight_desc_layout())


def split_k_tiles(tiles: int, k_tiles: int, sms: int, programs: int, resident: int) -> int:
    """K tiles per program of a launch of ``tiles`` 64-row tiles over ``k_tiles`` 128-column tiles: the split
    doubles until ``programs`` per SM (at most 64 splits, none empty), then halves while the launch needs more
    than one wave of ``resident`` programs per SM (0: no cap). H200, V4.1's wq_b [32768, 1280] at 1 row
    (docs/performance.md, twenty-first pass): 2 splits = 1024 programs (1.11 waves of 7) in 18.3 us a call in a
    ring, 1 split = 512 in 15.6."""
    split = 1
    while tiles * split < programs * sms and split * 2 <= min(k_tiles, 64):
        split *= 2
    while resident and split > 1 and tiles * split > resident * sms:  # a second wave costs a whole program
        split //= 2
    return -(-k_tiles // split)


def prefetch_distance(want: int, stages: int, programs: int, k_tiles: int, budget: int = GEMV_L2_BUDGET) -> int:
    """The ``PREFETCH`` constexpr of a launch: ``want`` tiles ahead, cut so that ``programs`` x (distance -
    stages + 1) tiles of 8 KB fit ``budget`` bytes and to the program's ``k_tiles``; 0 when nothing is left past
    the ring's own ``stages - 1`` tiles."""
    dist = min(want, k_tiles)
    while dist > stages - 1 and programs * (dist - stages + 1) * 8192 > budget:
        dist -= 1
    return dist if dist > stages - 1 else 0


def launch_plan(m: int, n: int, k: int, sms: int, stages: int, programs: int | None = None,
                resident: int | None = None, prefetch: int | None = None) -> tuple[int, int, int, int, int]:
    """(64-row tiles, BLOCK_M, K columns a split, splits, PREFETCH) of ``gemv_wgmma`` for x [m, k] and q [n, k]
    (``programs`` / ``resident`` / ``prefetch``: ``WGMMA_GEMV_TUNE``'s and ``GEMV_L2_PREFETCH`` when None)."""
    tune = WGMMA_GEMV_TUNE
    tiles = triton.cdiv(n, 64)
    block_m = 8 if m <= 8 else 16 if m <= 16 else 32
    if resident is None:
        resident = RESIDENT_32 if block_m == 32 and tune["resident"] else tune["resident"]
    k_per = split_k_tiles(tiles, k // 128, sms, programs or tune["programs"], resident) * 128
    split = triton.cdiv(k, k_per)
    dist = prefetch_distance(GEMV_L2_PREFETCH if prefetch is None else prefetch, stages, tiles * split, k_per // 128)
    return tiles, block_m, k_per, split, dist


def gemv_wgmma(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, s_cols: int, bn_blk: int, bk_blk: int, sms: int,
               ng: int | None = None, stages: int | None = None, programs: int | None = None,
               safe: bool | None = None, pdl: bool | None = None, tma: bool | None = None,
               resident: int | None = None, swizzle: bool | None = None, early: bool | None = None,
               prefetch: int | None = None) -> torch.Tensor:
    """y [M, N] bf16 = x [M, K] @ dequant(q [N, K] e4m3, s)^T for M <= 32 (``takes`` must hold); s the
    UE8M0 bytes [ceil(N / bn_blk), s_cols]. Keyword arguments: tuning knobs (defaults ``WGMMA_GEMV_TUNE``;
    ``early``: ``GEMV_EARLY_RELEASE``, only under PDL; ``prefetch``: ``GEMV_L2_PREFETCH``)."""
    from deepinfer_nvidia.kernels.triton_fp8_gemv import _counters

    m, (n, k) = x.shape[0], q.shape
    xp = x if x.stride(1) == 1 and x.stride(0) % 2 == 0 else x.contiguous()  # the kernel gathers permute_x's order
    stages = stages or WGMMA_GEMV_TUNE["stages"]
    tiles, block_m, k_per, split, prefetch = launch_plan(m, n, k, sms, stages, programs, resident, prefetch)
    if safe is None:
        safe = not scales_allow_fast(s)
    pdl = bool(pdl_launch()) if pdl is None else pdl  # the step's shared switch (SM90+, DEEPINFER_NV_PDL)
    pdl_mode = (2 if (GEMV_EARLY_RELEASE if early is None else early) else 1) if pdl else 0
    tma = GEMV_TMA if tma is None else tma
    q8 = q.view(torch.uint8)
    desc = weight_desc(q8) if tma and tma_fits(q8) else None
    swizzle = (GEMV_SWIZZLE if swizzle is None else swizzle) and desc is None
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    part = torch.empty(split, m, n, dtype=torch.float32, device=x.device) if split > 1 else y
    cnt = _counters(x.device, tiles) if split > 1 else part
    _wgmma_gemv_kernel[(tiles, split)](xp, q.view(torch.uint8), s.view(torch.uint8), y, part, cnt, m, n, k,
                                       xp.stride(0), s_cols, ng or n, k_per, BN_BLK=bn_blk, BK_BLK=bk_blk, SPLIT=split,
                                       BLOCK_M=block_m, STAGES=stages,
                                       SAFE=int(safe), PDL=pdl_mode, TMA=int(desc is not None), q_desc=desc,
                                       num_warps=4, SWIZZLE=int(swizzle), PREFETCH=prefetch,
                                       PF_LINE=int(_l2.LINE),
                                       **({"launch_pdl": True} if pdl else {}))
    return y
