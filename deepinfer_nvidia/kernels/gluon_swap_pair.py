"""The swap experts' launches at a few pairs with two warpgroups a program, each on every other K tile.

Why (docs/performance.md, twenty-first to twenty-fifth passes). At 1 token the up launch has 216 four-warp programs
on 132 SMs: ~6.6 warps an SM, each issuing every ~3.5 cycles with no dominant stall, so the SM runs out of warps
(and of bytes in flight) rather than of any one resource. A plain streaming loop over the same bytes went from 1.78
to 3.41 TB/s with 8 warps a program instead of 4 (``pass21c``). Splitting K over more programs did not help: each
split stores fp32 partials and the last program to arrive adds them (twenty-first pass, +10% a layer).

Here a program keeps its (expert block, 64-row tile) and runs 8 warps: warpgroup ``h`` (warps 4h..4h+3) decodes
K tile ``2i + h`` at step ``i``. Both warpgroups issue one ``wgmma`` with M = 128 (their 64 rows each) and N =
2 x BLOCK_M: the activation tile of a step holds the pairs' columns of tile ``2i`` in rows ``0..BLOCK_M-1`` and of
tile ``2i + 1`` in rows ``BLOCK_M..2*BLOCK_M-1``, so warpgroup 0's useful block is ``acc[0:64, 0:BLOCK_M]`` and
warpgroup 1's ``acc[64:128, BLOCK_M:]`` (the other two blocks are products with the wrong tile, computed and
dropped: the tensor cores are idle at these sizes). At the end the two useful blocks meet in shared memory and are
added (even tiles' sum + odd tiles' sum), then the epilogue is the one-warpgroup kernel's (``_up_finish``,
``_down_finish``).

Same bytes, same decode (``_decode_fragment``), same K order as ``gluon_moe_swap`` (AREG 2, 16-byte ``cp.async``
ring, the scales staged in shared memory once); only the order of the fp32 sums differs (two interleaved halves),
as a K split's does. No K split, no TMA. Used by ``swap_mxfp4`` where ``takes`` says so (``PAIR_WARPGROUPS``).
"""
from __future__ import annotations

import os

import torch
import triton

from deepinfer_nvidia.kernels import gluon_moe_swap as _swap
from deepinfer_nvidia.kernels import l2_prefetch as _l2
from deepinfer_nvidia.kernels.l2_prefetch import prefetch_asm
from deepinfer_nvidia.kernels.triton_pdl import pdl_launch

# On where the one-warpgroup up launch would fill less than ``PAIR_MAX_WAVES`` waves of 3 programs an SM (1 token:
# 216 programs, 0.55 waves) and the pairs fit 8-pair blocks. ``DEEPINFER_NV_SWAP_PAIR=0`` turns it off (A/B runs).
PAIR_WARPGROUPS = os.environ.get("DEEPINFER_NV_SWAP_PAIR", "1") == "1"
PAIR_MAX_WAVES = 1.0
PAIR_BLOCK_M = 8  # pairs a block: N = 16 for the two-tile wgmma, so the accumulators stay 8 registers a matrix
# cp.async ring depth (steps of two K tiles). 3: 94 KB of shared memory a program with the staged scales; 4: 112 KB,
# still two programs an SM (2 x (112 + 1 reserved) <= 228 KB), prepared for timing (``DEEPINFER_NV_SWAP_PAIR_STAGES``,
# ``bench_swap --pair-stages``). Measured in the twenty-sixth pass: 4 stages 70.8 us a layer at one token against
# 68.2 at 3 (``pass26a``), so 3 stays.
PAIR_STAGES = int(os.environ.get("DEEPINFER_NV_SWAP_PAIR_STAGES", "3"))
# Registers a thread: two 8-warp programs an SM need <= 128 (Triton 3.6 allocates 128 for the up kernel unasked,
# 3.9 130, and under the cap spills 6 outside the K loop, none inside: tests/kernels/test_gluon_swap_pair_sass.py).
PAIR_MAXNREG = 128
# Registers a thread for the down launch (91 used). Capped at 64 (four programs an SM instead of two, one round for
# one token's 480 down programs) it measured the same on an H100: 21.5 us at 128 and 21.7 at 64 with PDL off
# (deepinfer_nvidia/tests/probe_down_cap.py, docs/performance.md, thirty-seventh pass), so residency is not what
# bounds it; at 48 (30 spills) 1.7x slower. A module constant for the probe, not a knob.
PAIR_DOWN_MAXNREG = PAIR_MAXNREG
# Steps (two K tiles) ahead of the one being decoded that a program asks L2 for (``l2_prefetch``): steps
# STAGES-1 .. PREFETCH-1 right after the wait, then step i + PREFETCH at step i, so the ring's ``cp.async`` would find
# its bytes in L2. 0 (the default): off. Measured slower on an H100 at one token (65.5 -> 70.5 us by lines, 65.8 ->
# 99.5 by bulk requests; docs/performance.md, thirty-fourth pass). ``DEEPINFER_NV_SWAP_L2_PREFETCH``.
PAIR_L2_PREFETCH = int(os.environ.get("DEEPINFER_NV_SWAP_L2_PREFETCH", "0"))
# Each warpgroup in its own Gluon warp-specialized partition (its own ring, scale words and named barrier, m64n8
# wgmma; the halves added after the join) was bit-equal and slower on an H100 at one token: up 38.7 -> 41.4-41.7 us,
# down 21.5 -> 22.0-22.1, 4 tokens 115 -> 128-130 (docs/performance.md, thirty-ninth pass), so it was removed.
# The weights loaded as int32 words straight into registers a step ahead, every step's activations held in shared
# memory, no ring and no barrier in the K loop: bit-equal, slower at one token (up 38.5 -> 57.0 us, down 21.4 ->
# 24.5; L2-only loads the same), so it was removed too (docs/performance.md, thirty-ninth pass).
# Under PDL, the down launch asks for its ring's first weight tiles and its scale words before its wait (only h, the
# up launch's output, after it), so they stream while the up launch ends, as the FP8 GEMV does with its weights.
# The same bytes into the same slots (bit-equal by construction; device replay test). On since the thirty-ninth pass
# (H100, V4.1 batch 1 pipelined 2.33 / 2.30 -> 2.28 / 2.27 ms, alternated); ``DEEPINFER_NV_SWAP_EARLY_WEIGHTS=0``: off.
PAIR_EARLY_WEIGHTS = os.environ.get("DEEPINFER_NV_SWAP_EARLY_WEIGHTS", "1") == "1"
# The up launch at one token spread evenly over two programs an SM (stream-K: 264 programs of 17 steps, split tiles'
# partials added by the last to arrive) was bit-stable and slower: one token's call 58.2 -> 65.1 us, batch 1 +35 us
# (H100, docs/performance.md, forty-first pass): a program's chain of steps sets the launch, not the SM's share of
# programs, so it was removed.
# Two CTA barriers a K step instead of three (each thread's async-proxy fence right after its ring wait, so the barrier
# that publishes a step's copies also publishes them to wgmma, CUTLASS's order) was bit-equal and no faster: one
# token's call 56.6 -> 57.3 us, batch 1 even (H100, docs/performance.md, forty-first pass), so the loop keeps three.
# One barrier a step (the ring one slot deeper than its copies run ahead, so a step issues its copies before waiting
# for the previous step's wgmma, whose latency then overlaps the issue and the ring wait) was bit-equal and slower
# too: 56.5 -> 58.1 us a one-token call, batch 1 even (same pass). Neither the barriers nor the wgmma wait hold the
# loop; ``probe_pair_variant`` times such a module switch.
# The slot sum (``sum_slices``) done inside the down launch by the program that stores a token's last pair row of a
# tile (acquire-release counts, the same bits) was slower: one token's call 60.3 -> 61.7 us, two 114.6 -> 117.8
# (H100, docs/performance.md, thirty-ninth pass), so the launch stays.
_GLUON = _swap.available()

if _GLUON:
    from deepinfer_nvidia.kernels.gluon_api import (
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

    _decode_fragment = _swap._decode_fragment
    _frag128 = _swap._frag128
    _up_finish = _swap._up_finish
    _down_finish = _swap._down_finish
    _grid_dependency = _swap._grid_dependency
    _word_buffers = _swap._word_buffers
    _pair_scales = _swap._staged  # step i's bytes [128, 4, 1] from the staged words (row 64h + r: tile 2i + h)

    # [128, 4, 16] packed bytes: rows 64h + r are weight row r of K tile 2i + h, held by warpgroup h
    _FRAG_PAIR = gl.constexpr(_swap._fragment_bytes_layout(128, warpgroups=2))
    _PF64 = gl.constexpr(prefetch_asm(64))
    _PF32 = gl.constexpr(prefetch_asm(32))
    _PF_LINE = gl.constexpr(prefetch_asm(0))

    @gluon.jit
    def _issue_weights(ring_a, ring_b, wa_ptr, wb_ptr, woff3, nm3, gcol3, KG, j, stage, UP: gl.constexpr):
        """cp.async of step ``j``'s weight bytes (K tiles 2j and 2j + 1: 128 bytes of each row) into ring slot
        ``stage``; groups past K are masked (zero-filled). No commit."""
        gm = j * 8 + gcol3 < KG
        _cp_async(ring_a.index(stage), wa_ptr + woff3 + j * 128, mask=nm3 & gm)
        if UP:
            _cp_async(ring_b.index(stage), wb_ptr + woff3 + j * 128, mask=nm3 & gm)

    @gluon.jit
    def _issue_x(ring_x, x_ptr, xoff, vx, xk, K, j, stage):
        """cp.async of step ``j``'s 256 activation columns (K tiles 2j and 2j + 1) into ring slot ``stage``, columns
        past K zero-filled, then one commit group (which also takes the weight copies issued since the last)."""
        _cp_async(ring_x.index(stage), x_ptr + xoff + j * 256, mask=vx & (j * 256 + xk < K))
        async_copy.commit_group()

    @gluon.jit
    def _issue_pair(ring_a, ring_b, ring_x, wa_ptr, wb_ptr, x_ptr, woff3, nm3, gcol3, xoff, vx, xk, KG, K, j, stage,
                    UP: gl.constexpr):
        """cp.async of step ``j`` (K tiles 2j and 2j + 1: 128 bytes of each weight row, 256 activation columns)
        into ring slot ``stage``; groups and columns past K are masked (zero-filled), then one commit group."""
        _issue_weights(ring_a, ring_b, wa_ptr, wb_ptr, woff3, nm3, gcol3, KG, j, stage, UP)
        _issue_x(ring_x, x_ptr, xoff, vx, xk, K, j, stage)

    @gluon.jit
    def _prefetch_rows(wa_ptr, wb_ptr, e64, tile, N, row_bytes, UP: gl.constexpr, LINE: gl.constexpr,
                       num_warps: gl.constexpr):
        """[256] byte addresses for ``_prefetch_step`` and whether each thread asks: thread t takes weight row
        ``tile * 64 + t % 64``; part t // 64 is, for the up launch, the first / second 64 bytes of a step's 128 in
        w1 (parts 0, 1) and w3 (2, 3), else a 32-byte quarter of w2's. LINE: only the parts at a step's first byte
        ask (the row's 128-byte line)."""
        LP: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
        t = gl.arange(0, 256, layout=LP)
        rn = tile * 64 + t % 64
        part = t // 64
        off = e64 * N * row_bytes + rn.to(gl.int64) * row_bytes
        if UP:
            ptr = gl.where(part < 2, wa_ptr + off, wb_ptr + off) + (part % 2) * 64
            lead = part % 2 == 0
        else:
            ptr = wa_ptr + off + part * 32
            lead = part == 0
        ok = rn < N
        if LINE:
            ok = ok & lead
        return ptr, ok

    @gluon.jit
    def _prefetch_step(pf_ptr, pf_ok, j, n_s, UP: gl.constexpr, LINE: gl.constexpr):
        """Ask L2 for step ``j``'s weight bytes (128 a row and matrix, at byte 128 j of the row; nothing past
        ``n_s``): one request a thread that asks, no result (LINE: ``prefetch.global.L2`` of the line, else
        ``cp.async.bulk.prefetch.L2`` of its part)."""
        live = (pf_ok & (j < n_s)).to(gl.int32)
        if LINE:
            asm: gl.constexpr = _PF_LINE
        elif UP:
            asm: gl.constexpr = _PF64
        else:
            asm: gl.constexpr = _PF32
        gl.inline_asm_elementwise(asm, "=r,l,r", [pf_ptr + j * 128, live], dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def _stage_pair_scales(s_ptr, e64, N, KW, tile, n_s, KT_PAD: gl.constexpr, num_warps: gl.constexpr):
        """Every step's scale words of this program -> shared int32 [KT_PAD, 128]: word [i, 64h + r] is row r's 4
        UE8M0 bytes of K tile 2i + h (``s_ptr``: the stack as int32 [E, N, KW = K/128]). Staged once, so no step
        waits on a global load for its scales (``gluon_moe_swap.SWAP_SCALES_SMEM``'s idea in the pair order).
        Masked words are 0x7f7f7f7f (scale 1.0; their weights are zero-filled)."""
        LR: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [num_warps, 1], [1, 0])
        st = gl.expand_dims(gl.arange(0, KT_PAD, layout=gl.SliceLayout(1, LR)), 1)
        q = gl.expand_dims(gl.arange(0, 128, layout=gl.SliceLayout(0, LR)), 0)
        rn = tile * 64 + q % 64
        kt = 2 * st + q // 64
        words = gl.load(s_ptr + e64 * N * KW + rn.to(gl.int64) * KW + kt, mask=(st < n_s) & (kt < KW) & (rn < N),
                        other=0x7F7F7F7F)
        return _word_buffers(words, KT_PAD, 128)

    @gluon.jit
    def _fold(acc, BLOCK_M: gl.constexpr, LO: gl.constexpr):
        """``acc [128, 2*BLOCK_M]`` -> ``acc[0:64, :BLOCK_M] + acc[64:128, BLOCK_M:]`` ([64, BLOCK_M] in ``LO``):
        each warpgroup's useful block, met through shared memory."""
        buf = gl.allocate_shared_memory(gl.float32, [128, 2 * BLOCK_M], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]),
                                        acc)
        _cta_barrier()
        even = buf.slice(0, 64, 0).slice(0, BLOCK_M, 1).load(LO)
        odd = buf.slice(64, 64, 0).slice(BLOCK_M, BLOCK_M, 1).load(LO)
        return even + odd

    @gluon.jit
    def _swap_pair_kernel(x_ptr, pair_ptr, bexp_ptr, wa_ptr, sa_ptr, wb_ptr, sb_ptr, wt_ptr, out_ptr, P, E, N, K,
                          row_bytes, stride_x, limit, NT, TOPK: gl.constexpr, UP: gl.constexpr,
                          BLOCK_M: gl.constexpr, STAGES: gl.constexpr, SAFE: gl.constexpr,
                          SKIP_PAD: gl.constexpr, KT_PAD: gl.constexpr, num_warps: gl.constexpr,
                          PDL: gl.constexpr = 0, PREFETCH: gl.constexpr = 0, PF_LINE: gl.constexpr = 1,
                          EARLY_W: gl.constexpr = 0, PACKED: gl.constexpr = 0):
        """One (expert block, 64-row tile) of ``gluon_moe_swap._swap_kernel`` (AREG 2, no split; the same
        arguments, layouts and outputs; the scale stacks as int32 words) on two warpgroups, each taking every other
        128-column K tile. ``KT_PAD``: a power of 2 >= the steps, cdiv(K / 128, 2). ``PREFETCH`` (> STAGES - 1):
        steps asked of L2 ahead of the ring (``PAIR_L2_PREFETCH``). ``EARLY_W`` (the down launch under PDL,
        ``PAIR_EARLY_WEIGHTS``): the ring's first weight tiles and the scale words are requested before the wait, the
        activations (the up launch's ``h``) after it."""
        if PDL and not EARLY_W:  # programmatic dependent launch (triton_pdl): wait for the previous kernel, release
            _grid_dependency(True)  # the next
            _grid_dependency(False)
        gl.static_assert(not (EARLY_W and UP))  # the up launch's expert ids come from the kernel just before it
        gl.static_assert(num_warps == 8)
        L3: gl.constexpr = _FRAG_PAIR
        LS: gl.constexpr = gl.SliceLayout(2, L3)
        LX: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [num_warps, 1], [1, 0])
        ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, 2 * BLOCK_M, 16])
        AOP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=ACC, k_width=2)
        SM: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        RING: gl.constexpr = gl.SwizzledSharedLayout(16, 1, 1, [2, 1, 0])
        LO: gl.constexpr = gl.BlockedLayout([1, 1], [32 // BLOCK_M, BLOCK_M], [num_warps, 1], [1, 0])
        pid = gl.program_id(0)
        tile = pid % NT
        blk = pid // NT
        e = gl.load(bexp_ptr + blk)
        if e >= E:
            return
        e64 = e.to(gl.int64)
        n_s = gl.cdiv(gl.cdiv(K, 128), 2)  # steps: tiles 2i and 2i + 1
        KG = K // 32
        # activation rows of a step: q = h * BLOCK_M + m holds pair row m's columns of K tile 2i + h
        q = gl.arange(0, 2 * BLOCK_M, layout=gl.SliceLayout(1, LX))
        rows_x = blk * BLOCK_M + q % BLOCK_M
        if UP:
            pair_x = gl.load(pair_ptr + rows_x)
            xrow = (pair_x // TOPK).to(gl.int64) * stride_x
            vx = gl.expand_dims(pair_x < P, 1)
        else:
            xrow = rows_x.to(gl.int64) * stride_x
            if SKIP_PAD:
                vx = gl.expand_dims(gl.load(pair_ptr + rows_x) < P, 1)
            else:
                vx = gl.expand_dims(rows_x >= 0, 1)
        xk = gl.expand_dims((q // BLOCK_M) * 128, 1) + gl.expand_dims(gl.arange(0, 128, layout=gl.SliceLayout(0, LX)),
                                                                       0)
        xoff = gl.expand_dims(xrow, 1) + xk
        # weight fragment rows: 64h + r is row r of the tile, read at K tile 2i + h (group column 4h + g)
        q3 = gl.arange(0, 128, layout=gl.SliceLayout(1, LS))
        rn3 = tile * 64 + q3 % 64
        rg3 = gl.arange(0, 4, layout=gl.SliceLayout(0, LS))
        rb3 = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(0, L3)))
        nm = gl.expand_dims(rn3 < N, 1)
        nm3 = gl.expand_dims(nm, 2)
        gcol = gl.expand_dims((q3 // 64) * 4, 1) + gl.expand_dims(rg3, 0)
        gcol3 = gl.expand_dims(gcol, 2)
        woff = gl.expand_dims(e64 * N * row_bytes + rn3.to(gl.int64) * row_bytes, 1) + gcol * 16
        woff3 = gl.expand_dims(woff, 2) + gl.expand_dims(gl.expand_dims(rb3, 0), 0)

        ring_a = gl.allocate_shared_memory(gl.uint8, [STAGES, 128, 4, 16], RING)
        ring_x = gl.allocate_shared_memory(gl.bfloat16, [STAGES, 2 * BLOCK_M, 128], SM)
        acc_a = warpgroup_mma_init(gl.zeros([128, 2 * BLOCK_M], gl.float32, layout=ACC))
        if UP:
            ring_b = gl.allocate_shared_memory(gl.uint8, [STAGES, 128, 4, 16], RING)
            acc_b = warpgroup_mma_init(gl.zeros([128, 2 * BLOCK_M], gl.float32, layout=ACC))
        else:
            ring_b = ring_a
        if PDL and EARLY_W:
            # the expert ids and pair rows were written two kernels back (the align launch, complete before the up
            # launch's wait let this one start), and weights and scales by no kernel: all asked for before the wait.
            # Commit groups (W0..W{S-2}, X0), (X1), ...: the loop's wait_group(STAGES - 1) still covers step i.
            for jp in gl.static_range(STAGES - 1):
                _issue_weights(ring_a, ring_b, wa_ptr, wb_ptr, woff3, nm3, gcol3, KG, jp, jp, UP)
            ss_a = _stage_pair_scales(sa_ptr, e64, N, KG // 4, tile, n_s, KT_PAD, num_warps)
            ss_b = ss_a
            _grid_dependency(True)
            _grid_dependency(False)
            for jp in gl.static_range(STAGES - 1):
                _issue_x(ring_x, x_ptr, xoff, vx, xk, K, jp, jp)
        else:
            for jp in gl.static_range(STAGES - 1):
                _issue_pair(ring_a, ring_b, ring_x, wa_ptr, wb_ptr, x_ptr, woff3, nm3, gcol3, xoff, vx, xk, KG, K,
                            jp, jp, UP)
            ss_a = _stage_pair_scales(sa_ptr, e64, N, KG // 4, tile, n_s, KT_PAD, num_warps)
            ss_b = _stage_pair_scales(sb_ptr, e64, N, KG // 4, tile, n_s, KT_PAD, num_warps) if UP else ss_a
        if PREFETCH:
            gl.static_assert(PREFETCH > STAGES - 1)
            pf_ptr, pf_ok = _prefetch_rows(wa_ptr, wb_ptr, e64, tile, N, row_bytes, UP, PF_LINE, num_warps)
            for jp in gl.static_range(STAGES - 1, PREFETCH):
                _prefetch_step(pf_ptr, pf_ok, jp, n_s, UP, PF_LINE)
        _cta_barrier()  # every warp's words are stored before any warp reads them
        ca = _pair_scales(ss_a, 0, rg3, LS)
        if UP:
            cb = _pair_scales(ss_b, 0, rg3, LS)
        for i in range(n_s):
            if UP:
                acc_a, acc_b = warpgroup_mma_wait(num_outstanding=0, deps=(acc_a, acc_b))
            else:
                acc_a = warpgroup_mma_wait(num_outstanding=0, deps=(acc_a,))
            _cta_barrier()  # every warpgroup's wgmma of step i-1 is done: its ring slot may be refilled
            j = i + STAGES - 1
            _issue_pair(ring_a, ring_b, ring_x, wa_ptr, wb_ptr, x_ptr, woff3, nm3, gcol3, xoff, vx, xk, KG, K, j,
                        j % STAGES, UP)
            if PREFETCH:
                _prefetch_step(pf_ptr, pf_ok, i + PREFETCH, n_s, UP, PF_LINE)
            nca = _pair_scales(ss_a, gl.minimum(i + 1, KT_PAD - 1), rg3, LS)  # the last step's read is unused
            if UP:
                ncb = _pair_scales(ss_b, gl.minimum(i + 1, KT_PAD - 1), rg3, LS)
            async_copy.wait_group(STAGES - 1)
            si = i % STAGES
            _cta_barrier()
            xs = ring_x.index(si).permute((1, 0))
            da = gl.convert_layout(_decode_fragment(ring_a.index(si).load(L3), ca, 128, SAFE, PACKED), AOP)
            if UP:
                db = gl.convert_layout(_decode_fragment(ring_b.index(si).load(L3), cb, 128, SAFE, PACKED), AOP)
            fence_async_shared()
            _cta_barrier()
            acc_a = warpgroup_mma(da, xs, acc_a, is_async=True)
            if UP:
                acc_b = warpgroup_mma(db, xs, acc_b, is_async=True)
                cb = ncb
            ca = nca
        async_copy.wait_group(0)
        rn = tile * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, LO))
        rows = blk * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, LO))
        nmask = gl.expand_dims(rn < N, 1)
        if UP:
            acc_a, acc_b = warpgroup_mma_wait(num_outstanding=0, deps=(acc_a, acc_b))
            ya = _fold(acc_a, BLOCK_M, LO)
            yb = _fold(acc_b, BLOCK_M, LO)
            hoff = gl.expand_dims(rows.to(gl.int64) * N, 0) + gl.expand_dims(_frag128(rn), 1)
            _up_finish(ya, yb, out_ptr, hoff, nmask, limit)
        else:
            acc_a = warpgroup_mma_wait(num_outstanding=0, deps=(acc_a,))
            y = _fold(acc_a, BLOCK_M, LO)
            pair = gl.load(pair_ptr + rows)
            valid = pair < P
            ym = gl.expand_dims(valid, 0) & nmask
            yoff = gl.expand_dims(pair.to(gl.int64) * N, 0) + gl.expand_dims(rn, 1)
            _down_finish(y, out_ptr, wt_ptr, pair, valid, yoff, ym)


def takes(programs: int, sms: int, d: int, f: int) -> bool:
    """Whether ``swap_mxfp4`` runs its two launches here: on (``PAIR_WARPGROUPS``), Gluon present, whole
    128-column tiles, and an up launch of ``programs`` 64-row programs under ``PAIR_MAX_WAVES`` waves of 3 an SM."""
    return (_GLUON and PAIR_WARPGROUPS and d % 128 == 0 and f % 128 == 0
            and programs < PAIR_MAX_WAVES * 3 * sms)


def launch(up: bool, grid: int, x, pair, bexp, w, s, wb, sb, wt, out, p: int, ne: int, n: int, k: int,
           stride_x: int, limit: float, nt: int, topk: int, safe: bool, skip_pad: bool, stages: int,
           prefetch: int | None = None, packed: bool = False) -> None:
    """One launch of ``_swap_pair_kernel`` (the arguments of ``gluon_moe_swap._swap_kernel``'s, byte stacks
    ``w`` and UE8M0 bytes ``s`` (``wb``/``sb``: w3 for the up launch, else repeated)), ``stages`` deep;
    ``prefetch``: steps asked of L2 ahead (default ``PAIR_L2_PREFETCH``; 0 or at most ``stages - 1``: none).
    ``packed``: ``w``/``wb`` are in core's word layout (``mxfp4_words``)."""
    prefetch = PAIR_L2_PREFETCH if prefetch is None else prefetch
    prefetch = prefetch if prefetch > stages - 1 else 0
    words = [a.view(torch.int32) for a in (s, sb)]  # a row's 4 scale bytes of a 128-column tile as one word
    _swap_pair_kernel[(grid,)](x, pair, bexp, w, words[0], wb, words[1], wt, out, p, ne, n, k, k // 2, stride_x,
                               float(limit), nt,
                               TOPK=topk, UP=int(up), BLOCK_M=PAIR_BLOCK_M, STAGES=stages, SAFE=int(safe),
                               SKIP_PAD=int(skip_pad), KT_PAD=triton.next_power_of_2(triton.cdiv(k // 128, 2)),
                               num_warps=8, maxnreg=PAIR_MAXNREG if up else PAIR_DOWN_MAXNREG, PREFETCH=prefetch,
                               PF_LINE=int(_l2.LINE), EARLY_W=int(PAIR_EARLY_WEIGHTS and not up),
                               PACKED=int(packed), **pdl_launch())
