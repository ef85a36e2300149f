"""Routed MXFP4 experts on Hopper: weight-stationary swap-AB wgmma kernels written in Gluon.

Why (docs/performance.md, eleventh pass). At decode batch sizes each routed expert holds 1-16 pairs. The
split-K GEMV kernels decode every weight element once per *pair* (~6.2 instructions per element per pair), and
``tl.dot_scaled`` on SM90 upcasts with ~9.6 instructions per element; at ~8.6 T e2m1 elements/s of copy
bandwidth against ~30 T thread instructions/s, the bandwidth allows about 3.5. Here, per (expert block of
16/32/64 pairs, 64 weight rows):

1. the packed weight tile arrives by 16-byte ``cp.async`` into a ``STAGES``-deep shared ring (the activation
   tile ``[BLOCK_M pairs, 128]`` beside it, already in the kernels' K order);
2. with ``AREG=2`` (the default tiles) each thread reads back exactly the bytes of its own ``wgmma`` A
   fragment (``_fragment_bytes_layout``: rows 16w+r and 16w+r+8, bytes 16c..16c+15 of a 128-column tile) and
   decodes them by inline PTX to exact bf16: 8 elements per 32-bit word with 2 shifts, 1 ``and`` and 1 ``lop3``
   per pair (the e2m1 bits placed at the bf16 exponent/mantissa boundary give ``E2M1 * 2^-126``), then
   ``mul.bf16x2`` by ``2^126`` and by the group's UE8M0 scale (``SAFE=0``: one multiply by ``scale * 2^126``,
   exact only when every scale byte is <= 128, which ``scales_allow_fast`` checks once per weight stack). The
   decoded registers *are* the A fragment, so ``wgmma`` (M = weight rows, N = pairs: swap-AB, no 64-row
   padding of 16 pairs) reads A from registers and B (activations) from shared memory;
3. the K order inside each 128 columns follows the fragment (``_decode_fragment``); ``permute_k`` puts the
   activations in that order and the up kernel writes ``h`` in it for the down kernel.

At 2-6 tokens the up launch is split over K (``SPLIT``; ``gluon_swap_split.split_for`` picks it from the waves): each
program of a (block, tile) covers a range of K tiles and stores fp32 partials, and the last to arrive (a
per-tile counter) adds them in split order and finishes, so the result differs from the unsplit launch only in
the order of the fp32 sums (docs/performance.md, nineteenth pass).

Also kept: ``AREG=1`` (A by the compiler's layout conversion), ``AREG=0`` (A through shared memory; the 128-pair
blocks, where the fragment decode spills) and ``PROBE`` (drops the fence, MMA or decode: ``bench_swap --probes``).

Numerics are the grouped path's: exact bf16 weights, fp32 accumulation, the reference's roundings in the SwiGLU and
the down product, fp32 weighting and the slot-order sum (``sum_slices``). The K permutations only reorder elements
inside each 16-wide MMA k-step, so on the H200 the results equal the ``aten`` provider's. Layout and flow follow
``triton_moe_scaled`` (``align`` blocks, ``h [blocks * BLOCK_M, F]``, ``y [P, D]``). Gluon ships with Triton >= 3.5
(else ``available()`` is False); SM90 only (``wgmma``); SM100 takes ``tl.dot_scaled``'s native MMA.
"""
from __future__ import annotations

import logging
import os

import torch
import triton

from deepinfer_nvidia.kernels import gluon_swap_split as policy
from deepinfer_nvidia.kernels.mxfp4_word_decode import _packed_word_asm, _word_asm
from deepinfer_nvidia.kernels.gluon_swap_layout import _weight_descs, block_m_for, permute_k, tma_fits
from deepinfer_nvidia.kernels.scale_checks import scales_allow_fast
from deepinfer_nvidia.kernels.triton_pdl import gluon_grid_dependency as _grid_dependency, pdl_launch

from deepinfer_nvidia.kernels.gluon_api import AVAILABLE as _GLUON

if _GLUON:  # Gluon is experimental: absent in older Triton, so the path is optional (gluon_api: the version shims)
    from deepinfer_nvidia.kernels.gluon_api import (
        REINTERPRET_PUBLIC as _REINTERPRET_PUBLIC,
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

# (block_n weight rows, block_k, warps, stages, areg) by BLOCK_M (pairs per block); areg 2: A decoded straight into
# the wgmma register fragment (64 x 128 tiles, 4 warps), 1: A in registers through a layout conversion, 0: A through
# shared memory (H200, eleventh pass). 128 rows with the fragment decode spill, so that entry keeps A in shared memory.
SWAP_TUNE: dict[int, tuple[int, int, int, int, int]] = {16: (64, 128, 4, 3, 2), 32: (64, 128, 4, 3, 2),
                                                        64: (64, 128, 4, 3, 2), 128: (64, 128, 4, 2, 0)}
# Pair counts [SWAP_MIN_PAIRS, SWAP_MAX_PAIRS] for which ``moe.experts_mxfp4`` (provider triton) takes this path on
# SM90; SWAP_MAX_PAIRS 0 disables it; ``DEEPINFER_NV_SWAP_PAIRS=min,max`` overrides both (benchmarks, A/B runs).
# H200, V4.1 widths (docs/performance.md, eleventh pass): it beat the previous default (split-K GEMV up to 512
# pairs, ``tl.dot_scaled`` above) at every measured size, 6 to 49152 pairs (1.2x at 6, 2.1-2.3x at 384-1536,
# 1.5x at 49152); up to 98304 by extrapolation, and dequant-once (``DEQUANT_PAIRS``) keeps the largest sizes.
SWAP_MIN_PAIRS = 1
SWAP_MAX_PAIRS = 98304
if os.environ.get("DEEPINFER_NV_SWAP_PAIRS"):
    SWAP_MIN_PAIRS, SWAP_MAX_PAIRS = (int(v) for v in os.environ["DEEPINFER_NV_SWAP_PAIRS"].split(","))
# Split-K of the up launch at a few pairs and its register cap: ``gluon_swap_split`` (policy and knobs).
# Weight tiles by TMA (one bulk copy and one mbarrier a matrix and stage) instead of 128 threads' 16-byte cp.async
# and a CTA barrier: bit-equal on the H200 but no faster (79.4 -> 79.2 us a layer at 1 token, 2-9% slower at 2-64,
# twentieth pass), so off. Only where the weight rows are 16-byte aligned and N is a multiple of BLOCK_N.
SWAP_TMA = False
# The down launch reads only the h rows of real pairs: its padding rows (pair >= P: BLOCK_M - 1 of 16 at 1 token)
# are masked, so their cp.async copies zero-fill the ring instead of reading h. A wgmma column depends only on its
# own x row, so the real rows' sums are unchanged (bit-equal by construction); at 1 token this takes 120 of the
# ~320 L2 sectors a K tile reads (ncu, docs/performance.md, twenty-second pass). ``DEEPINFER_NV_SWAP_DOWN_SKIP_PAD=0``
# reads every row, as before (``bench_swap --down-pad`` times both).
SWAP_DOWN_SKIP_PAD = os.environ.get("DEEPINFER_NV_SWAP_DOWN_SKIP_PAD", "1") == "1"
# Each program copies its whole range of scale bytes into shared memory once, with coalesced 4-byte loads (one
# word = a row's 4 scales of one 128-column tile), and each K step reads its tile's words from there; the default
# loads a tile's [64 rows, 4] bytes from global memory a step ahead, one 32-byte sector for every 4 bytes (29% of
# the 1-token up launch's L2 sectors are that excess: docs/performance.md, twenty-second pass). Bit-equal by
# construction (the same bytes reach the same decode). Measured (pass23a, ``bench_swap --scales-smem``): bit-equal,
# 79.1 -> 76.8 us at 1 token, 118.1 -> 113.9 at 2, 337 -> 330 at 8, 1697 -> 1670 at 64. On since the twenty-third
# pass; ``DEEPINFER_NV_SWAP_SCALES_SMEM=0`` loads the words from global memory every step. Fragment tiles (AREG=2).
SWAP_SCALES_SMEM = os.environ.get("DEEPINFER_NV_SWAP_SCALES_SMEM", "1") == "1"


def available() -> bool:
    return _GLUON


if _GLUON:
    def _fragment_bytes_layout(block_n, warpgroups=1):
        """[BLOCK_N, 4, 16] packed bytes (a 128-element K tile): warp w, lane (r = lane // 4, c = lane % 4) holds
        rows 16w + r and 16w + r + 8 (+64 per further register row block), bytes 16c..16c+15: the rows and the
        K quarter of its wgmma A fragment (m64n*k16, bf16) over the 8 k-steps of the tile. ``warpgroups`` 2
        (``gluon_swap_pair``, BLOCK_N 128): warps 4-7 hold rows 64-127 instead of registers."""
        regs = [[0, 0, 1], [0, 0, 2], [0, 0, 4], [0, 0, 8], [8, 0, 0]]
        warps = [[16, 0, 0], [32, 0, 0]] + [[64 * (1 << i), 0, 0] for i in range(warpgroups.bit_length() - 1)]
        regs += [[64 * warpgroups * (1 << i), 0, 0] for i in range((block_n // (64 * warpgroups)).bit_length() - 1)]
        lanes = [[0, 1, 0], [0, 2, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]]
        return gl.DistributedLinearLayout(reg_bases=regs, lane_bases=lanes, warp_bases=warps, block_bases=[],
                                          shape=[block_n, 4, 16])

    _FRAG_BYTES = gl.constexpr(_fragment_bytes_layout(64))
    _ASM_SAFE = gl.constexpr(_word_asm(True))
    _ASM_FAST = gl.constexpr(_word_asm(False))
    _ASM_PACKED_SAFE = gl.constexpr(_packed_word_asm(True))
    _ASM_PACKED_FAST = gl.constexpr(_packed_word_asm(False))

    @gluon.jit
    def _decode_halves(b, sc, SAFE: gl.constexpr, PACKED: gl.constexpr = 0):
        """The inline-PTX decode of packed bytes ``b`` (scales ``sc`` broadcast along the last dim): two bf16
        tensors shaped like ``b``; per 4 bytes, o0 packs nibbles (0, 4, 1, 5) and o1 (2, 6, 3, 7). ``PACKED``: the
        bytes are in core's word layout (``mxfp4_words``), decoded to the same values."""
        s16 = sc.to(gl.int16)
        if SAFE:  # 2^(s-127) as bf16 bits (s = 0: the subnormal 2^-127)
            bits = gl.where(s16 == 0, 64, s16 << 7)
            asm: gl.constexpr = _ASM_PACKED_SAFE if PACKED else _ASM_SAFE
        else:  # 2^(s-1) = scale * 2^126, valid for s <= 128 (checked by the wrapper)
            bits = (s16 + 126) << 7
            asm: gl.constexpr = _ASM_PACKED_FAST if PACKED else _ASM_FAST
        scale = gl.broadcast(bits.to(gl.bfloat16, bitcast=True), b)[0]
        return gl.inline_asm_elementwise(asm, "=r,=r,=r,=r,r,r,r", [b, scale], dtype=(gl.bfloat16, gl.bfloat16),
                                         is_pure=True, pack=4)

    @gluon.jit
    def _decode(b, sc, BN: gl.constexpr, BK: gl.constexpr, SAFE: gl.constexpr, PACKED: gl.constexpr = 0):
        """``b [BN, G, 16]`` uint8 (one MXFP4 group per thread), ``sc [BN, G, 1]`` UE8M0 -> ``[BN, BK]`` bf16 in
        the register K order: within each 8 elements, logical k' = 4*p1 + 2*s + p0 holds natural 4*p0 + p1 + 2*s."""
        G: gl.constexpr = BK // 32
        o0, o1 = _decode_halves(b, sc, SAFE, PACKED)
        # o_s[4q + 2*p1 + p0] = natural element 8q + 4*p0 + p1 + 2*s; keep each register pair (p0) whole
        j = gl.join(o0.reshape([BN, G, 4, 2, 2]), o1.reshape([BN, G, 4, 2, 2]))
        return j.permute(0, 1, 2, 3, 5, 4).reshape([BN, BK])

    @gluon.jit
    def _rev3(n):
        """Column n -> its position in the decoder's K order: the low 3 bits reversed (an involution)."""
        return (n & -8) | ((n & 1) << 2) | (n & 2) | ((n >> 2) & 1)

    @gluon.jit
    def _decode_fragment(b, sc, BN: gl.constexpr, SAFE: gl.constexpr, PACKED: gl.constexpr = 0):
        """``_decode`` for the fragment layout: ``b [BN, 4 (c), 16]`` -> ``[BN, 128]`` bf16 whose logical K index
        k = 32q + 16S + 8p + 2c + e holds physical element 32c + 8q + 4e + 2S + p (``frag_order``): thread c then
        holds K pairs 2c, 2c+1 (+8, +16 ...), the A fragment's columns."""
        o0, o1 = _decode_halves(b, sc, SAFE, PACKED)
        j = gl.join(o0, o1).reshape([BN, 4, 4, 2, 2, 2])  # (c, q, p, e, S)
        return j.permute(0, 2, 5, 3, 1, 4).reshape([BN, 128])  # (q, S, p, c, e)

    @gluon.jit
    def _decode_regs(b, sc, BN: gl.constexpr, BK: gl.constexpr, SAFE: gl.constexpr, AREG: gl.constexpr,
                     PACKED: gl.constexpr = 0):
        """The A tile for a register-operand wgmma: ``_decode_fragment`` (AREG 2) or ``_decode`` (AREG 1)."""
        if AREG == 2:
            return _decode_fragment(b, sc, BN, SAFE, PACKED)
        else:
            return _decode(b, sc, BN, BK, SAFE, PACKED)

    @gluon.jit
    def _frag128(n):
        """Natural column n -> its logical position in ``_decode_fragment``'s order (per 128 columns)."""
        m = n % 128
        return (n - m) + 32 * ((m // 8) % 4) + 16 * ((m // 2) % 2) + 8 * (m % 2) + 2 * (m // 32) + (m // 4) % 2

    @gluon.jit
    def _issue_tile(ring_a, ring_b, ring_x, wa_ptr, wb_ptr, x_ptr, woff3, nm3, rg3, xrow, vx, ck, KG, K, j, stage,
                    UP: gl.constexpr, BLOCK_K: gl.constexpr):
        """cp.async of K tile ``j`` into ring slot ``stage``: the packed weight rows of ``woff3`` (both matrices when
        UP) and the activation rows, then one commit group. Tiles past K are masked (zero-filled)."""
        G: gl.constexpr = BLOCK_K // 32
        gm = gl.expand_dims(gl.expand_dims(j * G + rg3 < KG, 0), 2)
        _cp_async(ring_a.index(stage), wa_ptr + woff3 + j * G * 16, mask=nm3 & gm)
        if UP:
            _cp_async(ring_b.index(stage), wb_ptr + woff3 + j * G * 16, mask=nm3 & gm)
        _cp_async(ring_x.index(stage), x_ptr + xrow + j * BLOCK_K + ck, mask=vx & (j * BLOCK_K + ck < K))
        async_copy.commit_group()

    @gluon.jit
    def _issue_tile_tma(ring_a, ring_b, ring_x, wa_desc, wb_desc, bars, x_ptr, xrow, vx, ck, wrow, K, j, stage, pred,
                        UP: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr):
        """K tile ``j`` into ring slot ``stage``: the weight boxes by TMA onto the stage's mbarrier (``pred``
        False issues nothing, for tiles past this program's range), the activation rows by ``cp.async`` (one
        commit group, as ``_issue_tile``)."""
        G: gl.constexpr = BLOCK_K // 32
        bar = bars.index(stage)
        mbarrier.expect(bar, BLOCK_N * BLOCK_K // 2 * (2 if UP else 1), pred=pred)
        _tma_load(wa_desc, [wrow, j * G, 0], bar, ring_a.index(stage), pred=pred)
        if UP:
            _tma_load(wb_desc, [wrow, j * G, 0], bar, ring_b.index(stage), pred=pred)
        _cp_async(ring_x.index(stage), x_ptr + xrow + j * BLOCK_K + ck, mask=vx & (j * BLOCK_K + ck < K))
        async_copy.commit_group()

    @gluon.jit
    def _scales(s_ptr, soff, nm, rg3, g0, KG):
        return gl.expand_dims(gl.load(s_ptr + soff + g0, mask=nm & gl.expand_dims(g0 + rg3 < KG, 0), other=127), 2)

    @gluon.jit
    def _stage_scales(s_ptr, e64, N, KW, k0, n_k, tile, BLOCK_N: gl.constexpr, KT_PAD: gl.constexpr,
                      num_warps: gl.constexpr):
        """Scale words of tiles ``k0 .. k0 + n_k - 1`` of this program's rows -> shared int32 [KT_PAD, BLOCK_N]
        (tile-major, so a K step takes its tile with ``.index``). ``s_ptr``: the stack as int32 [E, N, KW = K/128],
        a word = one row's 4 UE8M0 bytes of one 128-column tile. Consecutive threads take consecutive rows (the
        stores hit distinct banks; the loads' sectors, 8 tiles of a row each, are shared by the warps' later
        loads through L1); no layout conversion, whose scratch would cost another 16 KB of shared memory. Masked
        words are 0x7f7f7f7f (scale 1.0, as ``_scales``)."""
        LR: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [num_warps, 1], [1, 0])
        kt = gl.expand_dims(gl.arange(0, KT_PAD, layout=gl.SliceLayout(1, LR)), 1)
        rn = gl.expand_dims(tile * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, LR)), 0)
        words = gl.load(s_ptr + e64 * N * KW + rn.to(gl.int64) * KW + (k0 + kt), mask=(kt < n_k) & (rn < N),
                        other=0x7F7F7F7F)
        return _word_buffers(words, KT_PAD, BLOCK_N)

    @gluon.jit
    def _word_buffers(words, ROWS: gl.constexpr, WIDTH: gl.constexpr):
        """int32 ``words [ROWS, WIDTH]`` -> shared memory as ROWS rank-1 buffers of [WIDTH] (``_staged`` reads one)."""
        ss = gl.allocate_shared_memory(gl.int32, [ROWS, WIDTH], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
        ss.store(words)
        if _REINTERPRET_PUBLIC:
            return ss.reinterpret(gl.int32, [ROWS, WIDTH], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        else:
            return ss._reinterpret(gl.int32, [ROWS, WIDTH], gl.SwizzledSharedLayout(1, 1, 1, [0]))

    @gluon.jit
    def _staged(ss, t, rg3, LS: gl.constexpr):
        """Tile ``t``'s scale bytes [BLOCK_N, G, 1] uint8 (``_scales``' shape and layout) from the staged words."""
        w = gl.expand_dims(ss.index(t).load(gl.SliceLayout(1, LS)), 1)
        return gl.expand_dims(((w >> (8 * gl.expand_dims(rg3, 0))) & 255).to(gl.uint8), 2)

    @gluon.jit
    def _swap_kernel(x_ptr, pair_ptr, bexp_ptr, wa_ptr, sa_ptr, wb_ptr, sb_ptr, wt_ptr, out_ptr, part_ptr, cnt_ptr,
                     P, E, N, K, row_bytes, stride_x, limit, NT, R, TPS, TOPK: gl.constexpr, UP: gl.constexpr,
                     BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr,
                     SAFE: gl.constexpr, AREG: gl.constexpr, PROBE: gl.constexpr, SPLIT: gl.constexpr,
                     TMA: gl.constexpr, wa_desc, wb_desc, num_warps: gl.constexpr, PDL: gl.constexpr = 0,
                     SKIP_PAD: gl.constexpr = 0, SCALES_SMEM: gl.constexpr = 0, KT_PAD: gl.constexpr = 1,
                     PACKED: gl.constexpr = 0):
        """One (expert block, K split, N tile) of ``out = act(x_rows) @ W^T``, W [E, N, K/2] packed e2m1.
        UP: x rows are the pairs' tokens of ``x_ptr`` (K order already bit-reversed), W = w1 (``wa``) and w3
        (``wb``), out = h [R = blocks*BLOCK_M, N] = clamped SwiGLU, written in the bit-reversed K order of the
        down kernel. Not UP: x rows are h's rows of this block, W = w2, out = y [P, N] fp32 (times the routing
        weight). SPLIT > 1: program ``ks`` of a tile covers K tiles ``ks*TPS .. ks*TPS+TPS-1`` and stores its fp32
        sums to ``part`` ([SPLIT, 2, R, N] up, [SPLIT, P, N] down); the last of the tile's programs to arrive
        (``cnt``, zeroed int32 per (block, tile), reset here) adds the partials in split order and finishes.
        TMA: the weight tiles arrive by TMA (``wa_desc``/``wb_desc``: W as [E*N, K/32, 16] bytes, boxes
        [BLOCK_N, G, 16]), one bulk copy and one mbarrier a matrix and stage instead of 128 threads' ``cp.async``;
        the activations keep ``cp.async`` (their rows are gathered by pair). SKIP_PAD (down): h's padding rows
        (pair >= P) are not read; the ring gets zeros there. SCALES_SMEM: ``sa_ptr``/``sb_ptr`` are the scale stacks
        as int32 words, staged once (``_stage_scales``; KT_PAD >= TPS, a power of 2)."""
        if PDL:  # programmatic dependent launch (triton_pdl): wait for the previous kernel, release the next
            _grid_dependency(True)
            _grid_dependency(False)
        G: gl.constexpr = BLOCK_K // 32
        if AREG == 2:  # each thread loads exactly the bytes of its wgmma A fragment (BLOCK_N 64, K 128, 4 warps)
            gl.static_assert(BLOCK_N == 64 and BLOCK_K == 128 and num_warps == 4)
            L3: gl.constexpr = _FRAG_BYTES
        else:
            L3: gl.constexpr = gl.BlockedLayout([1, 1, 16], [32 // G, G, 1], [num_warps, 1, 1], [2, 1, 0])
        LS: gl.constexpr = gl.SliceLayout(2, L3)
        LX: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (BLOCK_K // 8), BLOCK_K // 8], [num_warps, 1], [1, 0])
        ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_M, 16])
        SM: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        AOP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=ACC, k_width=2)
        RING: gl.constexpr = gl.SwizzledSharedLayout(16, 1, 1, [2, 1, 0])
        pid = gl.program_id(0)
        tile = pid % NT  # N tile fastest, then the K split, then the block
        ks = (pid // NT) % SPLIT
        blk = pid // (NT * SPLIT)
        e = gl.load(bexp_ptr + blk)
        if e >= E:
            return
        e64 = e.to(gl.int64)
        # this program's K tiles: k0 .. k0 + n_k - 1; loads past them are masked (zero-filled, no traffic)
        k0 = ks * TPS
        n_k = gl.minimum(gl.cdiv(K, BLOCK_K) - k0, TPS)
        K_hi = gl.minimum(K, (k0 + n_k) * BLOCK_K)
        KG = K // 32  # scale groups a row: the scale stack's row stride
        KG_hi = K_hi // 32  # the masks' bound
        rows_x = blk * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, LX))
        if UP:
            pair_x = gl.load(pair_ptr + rows_x)
            xrow = gl.expand_dims((pair_x // TOPK).to(gl.int64) * stride_x, 1)
            vx = gl.expand_dims(pair_x < P, 1)
        else:
            xrow = gl.expand_dims(rows_x.to(gl.int64) * stride_x, 1)
            if SKIP_PAD:
                vx = gl.expand_dims(gl.load(pair_ptr + rows_x) < P, 1)
            else:
                vx = gl.expand_dims(rows_x >= 0, 1)
        ck = gl.expand_dims(gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, LX)), 0)
        rn3 = tile * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LS))
        rg3 = gl.arange(0, G, layout=gl.SliceLayout(0, LS))
        rb3 = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(0, L3)))
        nm = gl.expand_dims(rn3 < N, 1)
        nm3 = gl.expand_dims(nm, 2)
        # row_bytes = K / 2 as its own argument: the launcher specialises it on divisibility by 16, so each
        # thread's 16 bytes are known aligned and move as one 16-byte cp.async
        woff = gl.expand_dims(e64 * N * row_bytes + rn3.to(gl.int64) * row_bytes, 1) + gl.expand_dims(rg3 * 16, 0)
        woff3 = gl.expand_dims(woff, 2) + gl.expand_dims(gl.expand_dims(rb3, 0), 0)
        soff = gl.expand_dims(e64 * N * KG + rn3.to(gl.int64) * KG, 1) + gl.expand_dims(rg3, 0)

        if TMA:  # the same bytes as RING (row-major, unswizzled), written by the TMA unit
            WRING: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=3)
        else:
            WRING: gl.constexpr = RING
        ring_a = gl.allocate_shared_memory(gl.uint8, [STAGES, BLOCK_N, G, 16], WRING)
        ring_x = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_M, BLOCK_K], SM)
        dec_a = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_N, BLOCK_K], SM)
        acc_a = warpgroup_mma_init(gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=ACC))
        if UP:
            ring_b = gl.allocate_shared_memory(gl.uint8, [STAGES, BLOCK_N, G, 16], WRING)
            dec_b = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_N, BLOCK_K], SM)
            acc_b = warpgroup_mma_init(gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=ACC))
        else:
            ring_b = ring_a  # unused: only the up kernel has a second matrix
        wrow = e * N + tile * BLOCK_N  # this tile's first row of W viewed as [E*N, K/32, 16]
        if TMA:  # one mbarrier a stage; it completes when the stage's weight boxes have landed
            bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
            for sb in gl.static_range(STAGES):
                mbarrier.init(bars.index(sb), count=1)
            fence_async_shared()
            _cta_barrier()
        for jp in gl.static_range(STAGES - 1):  # prologue: the first STAGES-1 tiles in flight
            if TMA:
                _issue_tile_tma(ring_a, ring_b, ring_x, wa_desc, wb_desc, bars, x_ptr, xrow, vx, ck, wrow, K_hi,
                                k0 + jp, jp, jp < n_k, UP, BLOCK_N, BLOCK_K)
            else:
                _issue_tile(ring_a, ring_b, ring_x, wa_ptr, wb_ptr, x_ptr, woff3, nm3, rg3, xrow, vx, ck, KG_hi,
                            K_hi, k0 + jp, jp, UP, BLOCK_K)
        if SCALES_SMEM:
            ss_a = _stage_scales(sa_ptr, e64, N, KG // 4, k0, n_k, tile, BLOCK_N, KT_PAD, num_warps)
            ss_b = _stage_scales(sb_ptr, e64, N, KG // 4, k0, n_k, tile, BLOCK_N, KT_PAD, num_warps) if UP else ss_a
            _cta_barrier()  # every warp's words are stored before any warp reads them
            ca = _staged(ss_a, 0, rg3, LS)
            if UP:
                cb = _staged(ss_b, 0, rg3, LS)
        else:
            ca = _scales(sa_ptr, soff, nm, rg3, k0 * G, KG_hi)
            if UP:
                cb = _scales(sb_ptr, soff, nm, rg3, k0 * G, KG_hi)
        for i in range(n_k):
            # the previous tiles' wgmma are done: their ring slot and the decode buffers may be reused
            if UP:
                acc_a, acc_b = warpgroup_mma_wait(num_outstanding=0, deps=(acc_a, acc_b))
            else:
                acc_a = warpgroup_mma_wait(num_outstanding=0, deps=(acc_a,))
            _cta_barrier()
            j = i + STAGES - 1
            if TMA:
                fence_async_shared()  # this slot's generic-proxy reads (the last decode) before the TMA rewrites it
                _issue_tile_tma(ring_a, ring_b, ring_x, wa_desc, wb_desc, bars, x_ptr, xrow, vx, ck, wrow, K_hi,
                                k0 + j, j % STAGES, j < n_k, UP, BLOCK_N, BLOCK_K)
            else:
                _issue_tile(ring_a, ring_b, ring_x, wa_ptr, wb_ptr, x_ptr, woff3, nm3, rg3, xrow, vx, ck, KG_hi,
                            K_hi, k0 + j, j % STAGES, UP, BLOCK_K)
            if SCALES_SMEM:  # the next tile's words (clamped: the last step's read is not used)
                nca = _staged(ss_a, gl.minimum(i + 1, KT_PAD - 1), rg3, LS)
                if UP:
                    ncb = _staged(ss_b, gl.minimum(i + 1, KT_PAD - 1), rg3, LS)
            else:
                nca = _scales(sa_ptr, soff, nm, rg3, (k0 + i + 1) * G, KG_hi)
                if UP:
                    ncb = _scales(sb_ptr, soff, nm, rg3, (k0 + i + 1) * G, KG_hi)
            async_copy.wait_group(STAGES - 1)
            si = i % STAGES
            if TMA:  # the weight boxes of tile i: the stage's barrier completes once per use of the stage
                mbarrier.wait(bars.index(si), (i // STAGES) & 1)
            _cta_barrier()
            xs = ring_x.index(si).permute((1, 0))
            if AREG:  # A from registers (2: decoded straight into the fragment order, 1: the compiler converts)
                da = _decode_regs(ring_a.index(si).load(L3), ca, BLOCK_N, BLOCK_K, SAFE, AREG, PACKED)
                da = gl.convert_layout(da, AOP)
                if UP:
                    db = _decode_regs(ring_b.index(si).load(L3), cb, BLOCK_N, BLOCK_K, SAFE, AREG, PACKED)
                    db = gl.convert_layout(db, AOP)
                # the decode writes no shared memory: only x needs the fence and a barrier (fencing before the
                # decode instead, with no barrier here, measured no faster: twenty-second pass)
                if (PROBE & 1) == 0:
                    fence_async_shared()
                _cta_barrier()
                acc_a = warpgroup_mma(da, xs, acc_a, is_async=True)
                if UP:
                    acc_b = warpgroup_mma(db, xs, acc_b, is_async=True)
            else:
                if (PROBE & 4) == 0:
                    dec_a.store(_decode(ring_a.index(si).load(L3), ca, BLOCK_N, BLOCK_K, SAFE, PACKED))
                    if UP:
                        dec_b.store(_decode(ring_b.index(si).load(L3), cb, BLOCK_N, BLOCK_K, SAFE, PACKED))
                if (PROBE & 1) == 0:
                    fence_async_shared()
                _cta_barrier()
                if (PROBE & 2) == 0:
                    acc_a = warpgroup_mma(dec_a, xs, acc_a, is_async=True)
                    if UP:
                        acc_b = warpgroup_mma(dec_b, xs, acc_b, is_async=True)
                else:
                    acc_a = warpgroup_mma_init(acc_a)
                    if UP:
                        acc_b = warpgroup_mma_init(acc_b)
            if UP:
                cb = ncb
            ca = nca
        async_copy.wait_group(0)
        if TMA:  # every issued box has been waited for (only tiles < n_k are issued)
            for sb in gl.static_range(STAGES):
                mbarrier.invalidate(bars.index(sb))
        rn = tile * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ACC))
        rows = blk * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, ACC))
        nmask = gl.expand_dims(rn < N, 1)
        if UP:
            acc_a, acc_b = warpgroup_mma_wait(num_outstanding=0, deps=(acc_a, acc_b))
            hcol = _frag128(rn) if AREG == 2 else _rev3(rn)
            hoff = gl.expand_dims(rows.to(gl.int64) * N, 0) + gl.expand_dims(hcol, 1)
            if SPLIT == 1:
                _up_finish(acc_a, acc_b, out_ptr, hoff, nmask, limit)
            else:
                # partial sums of this program's K tiles (real pairs only: padding rows of h become 0 below,
                # as their zero activations make them without a split)
                pm = nmask & gl.expand_dims(gl.load(pair_ptr + rows) < P, 0)
                pa = part_ptr + ks.to(gl.int64) * 2 * R * N + hoff
                gl.store(pa, acc_a, mask=pm)
                gl.store(pa + R * N, acc_b, mask=pm)
                _cta_barrier()
                if gl.atomic_add(cnt_ptr + blk * NT + tile, 1, sem="acq_rel") == SPLIT - 1:
                    ta = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=ACC)
                    tb = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=ACC)
                    for sk in range(SPLIT):
                        pa = part_ptr + sk * 2 * R * N + hoff
                        ta += gl.load(pa, mask=pm, other=0.0, cache_modifier=".cg")
                        tb += gl.load(pa + R * N, mask=pm, other=0.0, cache_modifier=".cg")
                    _up_finish(ta, tb, out_ptr, hoff, nmask, limit)
                    gl.atomic_xchg(cnt_ptr + blk * NT + tile, 0)
        else:
            acc_a = warpgroup_mma_wait(num_outstanding=0, deps=(acc_a,))
            pair = gl.load(pair_ptr + rows)
            valid = pair < P
            ym = gl.expand_dims(valid, 0) & nmask
            yoff = gl.expand_dims(pair.to(gl.int64) * N, 0) + gl.expand_dims(rn, 1)
            if SPLIT == 1:
                _down_finish(acc_a, out_ptr, wt_ptr, pair, valid, yoff, ym)
            else:
                gl.store(part_ptr + ks.to(gl.int64) * P * N + yoff, acc_a, mask=ym)
                _cta_barrier()
                if gl.atomic_add(cnt_ptr + blk * NT + tile, 1, sem="acq_rel") == SPLIT - 1:
                    total = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=ACC)
                    for sk in range(SPLIT):
                        total += gl.load(part_ptr + sk * P * N + yoff, mask=ym, other=0.0, cache_modifier=".cg")
                    _down_finish(total, out_ptr, wt_ptr, pair, valid, yoff, ym)
                    gl.atomic_xchg(cnt_ptr + blk * NT + tile, 0)

    @gluon.jit
    def _up_finish(acc_a, acc_b, out_ptr, hoff, nmask, limit):
        """h = clamped SwiGLU of the fp32 sums, with the reference's bf16 roundings, stored at ``hoff``."""
        dtype: gl.constexpr = out_ptr.dtype.element_ty
        g = gl.minimum(acc_a.to(dtype).to(gl.float32), limit).to(dtype).to(gl.float32)
        sg = (g / (1.0 + gl.exp(-g))).to(dtype).to(gl.float32)
        u = gl.minimum(gl.maximum(acc_b.to(dtype).to(gl.float32), -limit), limit).to(dtype).to(gl.float32)
        gl.store(out_ptr + hoff, (sg * u).to(dtype), mask=nmask)

    @gluon.jit
    def _down_finish(acc, out_ptr, wt_ptr, pair, valid, yoff, ym):
        """y = bf16(sum) * routing weight (fp32) at the pairs' rows."""
        wt = gl.load(wt_ptr + pair, mask=valid, other=0.0)
        gl.store(out_ptr + yoff, acc.to(gl.bfloat16).to(gl.float32) * gl.expand_dims(wt, 0), mask=ym)


def swap_or_none(*args, **kwargs) -> torch.Tensor | None:
    """``swap_mxfp4(*args, **kwargs)``, or None when the installed Triton cannot compile the Gluon kernels (its
    experimental API moves between releases): then the path is switched off for the process, with one logged
    warning, and the caller takes its other kernels. Any other error propagates."""
    global SWAP_MAX_PAIRS
    from triton.compiler.errors import CompilationError

    try:
        return swap_mxfp4(*args, **kwargs)
    except CompilationError as exc:
        SWAP_MAX_PAIRS = 0
        logging.getLogger("deepinfer_nvidia.kernels").warning(
            "moe.experts_mxfp4[triton]: the Gluon swap-AB kernels do not compile with triton %s (%s); using the "
            "split-K / dot_scaled kernels from now on", triton.__version__, str(exc).splitlines()[-1][:200])
        return None


def supports_swap(x: torch.Tensor) -> bool:
    """Gluon present, an SM90 device, bf16 activations with unit-stride rows."""
    return (_GLUON and x.is_cuda and x.dtype == torch.bfloat16 and x.dim() == 2
            and torch.cuda.get_device_capability(x.device)[0] == 9)


def swap_mxfp4(x, weights, ids, w1, s1, w3, s3, w2, s2, limit, block_m: int | None = None,
               block_n: int | None = None, block_k: int | None = None, warps: int | None = None,
               stages: int | None = None, safe: bool | None = None, areg: int | None = None,
               probe: int = 0, split: tuple[int, int] | None = None, tma: bool | None = None,
               maxnreg: int | None = None, paired: bool | None = None, packed: bool = False, aligner=None
               ) -> torch.Tensor:
    """x [T, D] bf16; weights [T, k] float; ids [T, k] int; w1, w3 [E, F, D/2] uint8 + UE8M0 [E, F, D/32];
    w2 [E, D, F/2] + [E, D, F/32] -> [T, D] bf16. No host synchronisation after the first call per weight
    stack (CUDA-graph safe). D and F must be multiples of 32; the stacks must already be checked.
    ``split``: (up, down) K splits (default: ``policy.split_for`` of the up launch, the down one unsplit). ``tma``:
    weight tiles by TMA (default ``SWAP_TMA``; only where ``tma_fits``). ``maxnreg``: the up kernel's register
    cap (default ``gluon_swap_split.UP_MAXNREG``). ``paired``: both launches on two warpgroups a program
    (``gluon_swap_pair``; default: where its ``takes`` holds and no tile knob is given). ``packed``: the three
    byte stacks are in core's word layout (``mxfp4_words``: ``int32`` stacks viewed as bytes), scales unchanged.
    ``aligner(block_m, blocks, perm) -> (pair, block_expert, xp)``: a launch in place of ``align_small``'s."""
    from deepinfer_nvidia.kernels import gluon_swap_pair as pair_path  # lazy: it imports this module
    from deepinfer_nvidia.kernels.triton_fp8_gemv import _counters
    from deepinfer_nvidia.kernels.triton_gemm import _sm_count, sum_slices
    from deepinfer_nvidia.kernels.triton_align import ALIGN_MAX_PAIRS, align_small
    from deepinfer_nvidia.kernels.triton_moe import align, num_blocks  # lazy: triton_moe imports this module
    from deepinfer_nvidia.kernels.triton_moe_scaled import expert_shapes

    x, t, d, k, ne, f = expert_shapes(x, ids, w1)
    if t == 0 or k == 0:
        return torch.zeros(t, d, dtype=x.dtype, device=x.device)
    p = t * k
    bm = block_m or block_m_for(p, ne)
    pair_stages = stages
    if paired is None:  # the default tiles only: a pinned variant (benchmarks, tests) keeps the one-warpgroup kernel
        pinned = (block_m, block_n, block_k, warps, stages, areg, split, tma, maxnreg) != (None,) * 9 or probe
        programs = (num_blocks(p, ne, bm) - 1) * triton.cdiv(f, 64)  # the one-warpgroup up launch's live ones
        paired = not pinned and pair_path.takes(programs, _sm_count(x.device), d, f)
    if paired:
        bm = pair_path.PAIR_BLOCK_M
    tbn, tbk, tw, ts, ta = SWAP_TUNE.get(bm, SWAP_TUNE[16])
    bn, bk, warps, stages = block_n or tbn, block_k or tbk, warps or tw, stages or ts
    areg = ta if areg is None else areg
    if paired:  # its own tiles: 64 x 128 of the fragment decode, 8 warps, its own ring depth unless given
        bn, bk, warps, areg, stages = 64, 128, 8, 2, pair_stages or pair_path.PAIR_STAGES
    if areg == 2 and not paired and (d % 128 or f % 128 or bn != 64 or bk != 128 or warps != 4):
        areg = 1  # the fragment layout covers 64 x 128 tiles of 4 warps over whole 128-column tiles only
    if safe is None:
        safe = not scales_allow_fast(s1, s3, s2)
    if aligner is None and ids.is_cuda and p <= ALIGN_MAX_PAIRS and x.is_contiguous():  # the layout, x in K order
        aligner = lambda m, blocks, perm: align_small(ids, ne, m, blocks, x, perm)  # noqa: E731 (one launch)
    if aligner is not None:
        pair, bexp, xp = aligner(bm, num_blocks(p, ne, bm), 2 if areg == 2 else 1)
    else:
        pair, bexp = align(ids, ne, bm)
        xp = permute_k(x, areg == 2)
    nb = bexp.numel()
    u8 = [a.view(torch.uint8) for a in (w1, s1, w3, s3, w2, s2)]
    r = nb * bm
    h = torch.empty(r, f, dtype=x.dtype, device=x.device)
    nt1, nt2 = triton.cdiv(f, bn), triton.cdiv(d, bn)
    kt1, kt2 = triton.cdiv(d, bk), triton.cdiv(f, bk)
    wt = weights.reshape(-1).float().contiguous()
    if paired:
        pair_path.launch(True, nb * nt1, xp, pair, bexp, u8[0], u8[1], u8[2], u8[3], wt, h, p, ne, f, d,
                         xp.stride(0), limit, nt1, k, safe, False, stages, packed=packed)
        y = torch.empty(p, d, dtype=torch.float32, device=x.device)
        pair_path.launch(False, nb * nt2, h, pair, bexp, u8[4], u8[5], u8[4], u8[5], wt, y, p, ne, d, f, f,
                         limit, nt2, k, safe, SWAP_DOWN_SKIP_PAD, stages, packed=packed)
        return sum_slices(y, t, d, k, d, k * d, x.dtype)
    if split is None:  # programs that can hold pairs: at most min(E, P) + P // BLOCK_M blocks (num_blocks - 1)
        live = max(1, nb - 1)
        split = (policy.split_for(live * nt1, kt1, _sm_count(x.device)), 1)
    sp1, sp2 = policy.even_split(split[0], kt1), policy.even_split(split[1], kt2)
    if max(nb * nt1, nb * nt2) > (1 << 16):  # the shared counters cover 65536 tiles
        sp1 = sp2 = 1
    cnt = _counters(x.device, max(nb * nt1, nb * nt2)) if max(sp1, sp2) > 1 else wt
    part1 = torch.empty(sp1, 2, r, f, dtype=torch.float32, device=x.device) if sp1 > 1 else wt
    tma = SWAP_TMA if tma is None else tma
    tma = bool(tma) and all(tma_fits(w, bn, bk) for w in (w1, w3, w2))
    d1 = _weight_descs(u8[0], u8[2], bn, bk) if tma else (None, None)
    d2 = _weight_descs(u8[4], None, bn, bk) if tma else (None, None)
    staged = SWAP_SCALES_SMEM and areg == 2  # scales as int32 words (K/32 % 4 == 0 here), staged in shared memory
    sc = [u8[i].view(torch.int32) if staged else u8[i] for i in (1, 3, 5)]
    kp1, kp2 = (triton.next_power_of_2(triton.cdiv(kt, sp)) for kt, sp in ((kt1, sp1), (kt2, sp2)))
    _swap_kernel[(nb * sp1 * nt1,)](xp, pair, bexp, u8[0], sc[0], u8[2], sc[1], wt, h, part1, cnt, p, ne, f, d,
                                    d // 2, xp.stride(0), float(limit), nt1, r, triton.cdiv(kt1, sp1), TOPK=k, UP=1,
                                    BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, STAGES=stages, SAFE=int(safe), AREG=areg,
                                    PROBE=probe, SPLIT=sp1, TMA=int(tma), wa_desc=d1[0], wb_desc=d1[1],
                                    num_warps=warps, SCALES_SMEM=int(staged), KT_PAD=kp1, PACKED=int(packed),
                                    **pdl_launch(),
                                    **policy.up_options(maxnreg))
    y = torch.empty(p, d, dtype=torch.float32, device=x.device)
    part2 = torch.empty(sp2, p, d, dtype=torch.float32, device=x.device) if sp2 > 1 else wt
    _swap_kernel[(nb * sp2 * nt2,)](h, pair, bexp, u8[4], sc[2], u8[4], sc[2], wt, y, part2, cnt, p, ne, d, f,
                                    f // 2, f, float(limit), nt2, r, triton.cdiv(kt2, sp2), TOPK=k, UP=0,
                                    BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, STAGES=stages, SAFE=int(safe), AREG=areg,
                                    PROBE=probe, SPLIT=sp2, TMA=int(tma), wa_desc=d2[0], wb_desc=d2[1],
                                    num_warps=warps, SKIP_PAD=int(SWAP_DOWN_SKIP_PAD), SCALES_SMEM=int(staged),
                                    KT_PAD=kp2, PACKED=int(packed), **pdl_launch())
    return sum_slices(y, t, d, k, d, k * d, x.dtype)
