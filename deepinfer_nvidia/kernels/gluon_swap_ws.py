"""The paired swap experts (``gluon_swap_pair``) with each warpgroup in its own warp-specialized partition.

Why (docs/performance_pass_38.md). Nsight Compute's stall sampling of the paired kernel at one token: the K loop's
warps are ready about 38% of the time (selected or not selected), wait at barriers 17%, on the ALU pipe 14%. Its
eight warps meet at three CTA barriers a step (the x tile, copied by all 256 threads, is read by both warpgroups'
``wgmma``), so both warpgroups decode at once (the SM's ALU pipes saturate) and wait at once (they idle).

Here warpgroup ``h`` (the default partition for h = 0, one 4-warp worker for h = 1) runs the one-warpgroup loop of
``gluon_moe_swap`` over K tiles h, h + 2, h + 4, ... with its own ring (its weight tiles, its 8 pairs' x columns of
its tiles) and its own scale words, so its barriers are the partition's named barrier (128 threads) and the two
warpgroups drift apart freely. The ``wgmma`` is m64 n8 (the paired kernel's n16 computed a product with the other
warpgroup's tile and dropped it). At the end each stores its fp32 sum to shared memory, and after the partitions
join the default warps add them (even tiles' sum + odd tiles' sum, the paired kernel's order) and finish as it does.

Same bytes, decode, K order, fp32 sums and order of additions as ``gluon_swap_pair``: the outputs are bit-equal to
its (device test ``test_swap_ws_equals_pair``). Opt-in until measured: ``DEEPINFER_NV_SWAP_PAIR_WS=1``.
Gluon's ``warp_specialize`` (Triton >= 3.5); SM90.
"""
from __future__ import annotations

import triton

from deepinfer_nvidia.kernels import gluon_moe_swap as _swap, gluon_swap_pair as _pair
from deepinfer_nvidia.kernels.triton_pdl import pdl_launch

_GLUON = _swap.available()

if _GLUON:
    from deepinfer_nvidia.kernels.gluon_api import (
        async_copy,
        cta_barrier as _barrier,
        fence_async_shared,
        gl,
        gluon,
        warpgroup_mma,
        warpgroup_mma_init,
        warpgroup_mma_wait,
    )

    _FRAG = _swap._FRAG_BYTES  # [64, 4, 16] packed bytes of one warpgroup's fragment rows
    _grid_dependency = _swap._grid_dependency  # the PDL prologue's form every kernel shares (test_pdl_sass)

    @gluon.jit
    def _half(h: gl.constexpr, x_ptr, pair_ptr, wa_ptr, sa_ptr, wb_ptr, sb_ptr, sums, e64, tile, blk, P, N, K,
              row_bytes, stride_x, TOPK: gl.constexpr, UP: gl.constexpr, BLOCK_M: gl.constexpr,
              STAGES: gl.constexpr, SAFE: gl.constexpr, SKIP_PAD: gl.constexpr, KT_PAD: gl.constexpr):
        """Warpgroup h's K loop (tiles 2i + h): its fp32 sums [64, BLOCK_M] (matrix a; with UP also b) into
        ``sums`` rows [64 (2 m + h), +64) for matrix m."""
        L3: gl.constexpr = _FRAG
        LS: gl.constexpr = gl.SliceLayout(2, L3)
        LX: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
        ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_M, 16])
        AOP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=ACC, k_width=2)
        SM: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        RING: gl.constexpr = gl.SwizzledSharedLayout(16, 1, 1, [2, 1, 0])
        n_s = gl.cdiv(gl.cdiv(K, 128), 2)  # steps: this warpgroup's tile of each pair of K tiles
        KG = K // 32
        m = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, LX))
        rows_x = blk * BLOCK_M + m
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
        xk = h * 128 + gl.expand_dims(gl.arange(0, 128, layout=gl.SliceLayout(0, LX)), 0)
        xoff = gl.expand_dims(xrow, 1) + xk
        r3 = gl.arange(0, 64, layout=gl.SliceLayout(1, LS))
        rn3 = tile * 64 + r3
        rg3 = gl.arange(0, 4, layout=gl.SliceLayout(0, LS))
        rb3 = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(0, L3)))
        nm3 = gl.expand_dims(gl.expand_dims(rn3 < N, 1), 2)
        gcol = 4 * h + gl.expand_dims(rg3, 0)  # [1, 4]: this warpgroup's groups of each step
        gcol3 = gl.expand_dims(gcol, 2)
        woff = gl.expand_dims(e64 * N * row_bytes + rn3.to(gl.int64) * row_bytes, 1) + gcol * 16
        woff3 = gl.expand_dims(woff, 2) + gl.expand_dims(gl.expand_dims(rb3, 0), 0)

        ring_a = gl.allocate_shared_memory(gl.uint8, [STAGES, 64, 4, 16], RING)
        ring_x = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_M, 128], SM)
        acc_a = warpgroup_mma_init(gl.zeros([64, BLOCK_M], gl.float32, layout=ACC))
        if UP:
            ring_b = gl.allocate_shared_memory(gl.uint8, [STAGES, 64, 4, 16], RING)
            acc_b = warpgroup_mma_init(gl.zeros([64, BLOCK_M], gl.float32, layout=ACC))
        else:
            ring_b = ring_a
        for jp in gl.static_range(STAGES - 1):
            # this warpgroup's K tile 2j + h: h is in the offsets (woff3, gcol3, xk)
            _pair._issue_pair(ring_a, ring_b, ring_x, wa_ptr, wb_ptr, x_ptr, woff3, nm3, gcol3, xoff, vx, xk, KG, K,
                              jp, jp, UP)
        ss_a = _pair._stage_pair_scales(sa_ptr, e64, N, KG // 4, tile, n_s, KT_PAD, 4, h, 1)
        ss_b = _pair._stage_pair_scales(sb_ptr, e64, N, KG // 4, tile, n_s, KT_PAD, 4, h, 1) if UP else ss_a
        _barrier()  # (the partition's barrier) every warp's words are stored before any warp reads them
        ca = _swap._staged(ss_a, 0, rg3, LS)
        if UP:
            cb = _swap._staged(ss_b, 0, rg3, LS)
        for i in range(n_s):
            if UP:
                acc_a, acc_b = warpgroup_mma_wait(num_outstanding=0, deps=(acc_a, acc_b))
            else:
                acc_a = warpgroup_mma_wait(num_outstanding=0, deps=(acc_a,))
            _barrier()  # this warpgroup's wgmma of step i-1 is done: its ring slot may be refilled
            j = i + STAGES - 1
            _pair._issue_pair(ring_a, ring_b, ring_x, wa_ptr, wb_ptr, x_ptr, woff3, nm3, gcol3, xoff, vx, xk, KG, K,
                              j, j % STAGES, UP)
            nca = _swap._staged(ss_a, gl.minimum(i + 1, KT_PAD - 1), rg3, LS)  # the last step's read is unused
            if UP:
                ncb = _swap._staged(ss_b, gl.minimum(i + 1, KT_PAD - 1), rg3, LS)
            async_copy.wait_group(STAGES - 1)
            si = i % STAGES
            xs = ring_x.index(si).permute((1, 0))
            da = gl.convert_layout(_swap._decode_fragment(ring_a.index(si).load(L3), ca, 64, SAFE), AOP)
            if UP:
                db = gl.convert_layout(_swap._decode_fragment(ring_b.index(si).load(L3), cb, 64, SAFE), AOP)
            fence_async_shared()
            _barrier()  # every thread's x copies of this step landed and are fenced for the wgmma
            acc_a = warpgroup_mma(da, xs, acc_a, is_async=True)
            if UP:
                acc_b = warpgroup_mma(db, xs, acc_b, is_async=True)
                cb = ncb
            ca = nca
        async_copy.wait_group(0)
        if UP:
            acc_a, acc_b = warpgroup_mma_wait(num_outstanding=0, deps=(acc_a, acc_b))
            sums.slice(128 + 64 * h, 64, 0).store(acc_b)
        else:
            acc_a = warpgroup_mma_wait(num_outstanding=0, deps=(acc_a,))
        sums.slice(64 * h, 64, 0).store(acc_a)

    @gluon.jit
    def _swap_ws_kernel(x_ptr, pair_ptr, bexp_ptr, wa_ptr, sa_ptr, wb_ptr, sb_ptr, wt_ptr, out_ptr, P, E, N, K,
                        row_bytes, stride_x, limit, NT, TOPK: gl.constexpr, UP: gl.constexpr,
                        BLOCK_M: gl.constexpr, STAGES: gl.constexpr, SAFE: gl.constexpr,
                        SKIP_PAD: gl.constexpr, KT_PAD: gl.constexpr, WORKER_REGS: gl.constexpr,
                        num_warps: gl.constexpr, PDL: gl.constexpr = 0):
        """``gluon_swap_pair._swap_pair_kernel``'s arguments and outputs; 4 warps here (warpgroup 0, the default
        partition) and a 4-warp worker (warpgroup 1) with ``WORKER_REGS`` registers a thread."""
        if PDL:  # programmatic dependent launch (triton_pdl): wait for the previous kernel, release the next
            _grid_dependency(True)
            _grid_dependency(False)
        gl.static_assert(num_warps == 4)
        LO: gl.constexpr = gl.BlockedLayout([1, 1], [32 // BLOCK_M, BLOCK_M], [4, 1], [1, 0])
        pid = gl.program_id(0)
        tile = pid % NT
        blk = pid // NT
        e = gl.load(bexp_ptr + blk)
        if e >= E:
            return
        e64 = e.to(gl.int64)
        # fp32 sums [64, BLOCK_M] by (matrix, warpgroup): rows 64 (2 m + h)
        sums = gl.allocate_shared_memory(gl.float32, [256 if UP else 128, BLOCK_M],
                                         gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
        gl.warp_specialize([(_half, (0, x_ptr, pair_ptr, wa_ptr, sa_ptr, wb_ptr, sb_ptr, sums, e64, tile, blk, P, N,
                                     K, row_bytes, stride_x, TOPK, UP, BLOCK_M, STAGES, SAFE, SKIP_PAD, KT_PAD)),
                            (_half, (1, x_ptr, pair_ptr, wa_ptr, sa_ptr, wb_ptr, sb_ptr, sums, e64, tile, blk, P, N,
                                     K, row_bytes, stride_x, TOPK, UP, BLOCK_M, STAGES, SAFE, SKIP_PAD, KT_PAD))],
                           [4], [WORKER_REGS])  # warpgroup 0: the default partition; 1: the worker
        rn = tile * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, LO))
        rows = blk * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, LO))
        nmask = gl.expand_dims(rn < N, 1)
        ya = sums.slice(0, 64, 0).load(LO) + sums.slice(64, 64, 0).load(LO)  # even tiles' sum + odd tiles'
        if UP:
            yb = sums.slice(128, 64, 0).load(LO) + sums.slice(192, 64, 0).load(LO)
            hoff = gl.expand_dims(rows.to(gl.int64) * N, 0) + gl.expand_dims(_swap._frag128(rn), 1)
            _swap._up_finish(ya, yb, out_ptr, hoff, nmask, limit)
        else:
            pair = gl.load(pair_ptr + rows)
            valid = pair < P
            ym = gl.expand_dims(valid, 0) & nmask
            yoff = gl.expand_dims(pair.to(gl.int64) * N, 0) + gl.expand_dims(rn, 1)
            _swap._down_finish(ya, out_ptr, wt_ptr, pair, valid, yoff, ym)


# Registers a thread of each partition: two programs (16 warps) an SM need <= 128.
WS_REGS = 128


def launch(up: bool, grid: int, x, pair, bexp, words, wb, words_b, w, wt, out, p: int, ne: int, n: int, k: int,
           stride_x: int, limit: float, nt: int, topk: int, safe: bool, skip_pad: bool, stages: int,
           block_m: int) -> None:
    """One launch of ``_swap_ws_kernel`` with ``gluon_swap_pair.launch``'s arguments (scale stacks as int32
    ``words``)."""
    _swap_ws_kernel[(grid,)](x, pair, bexp, w, words, wb, words_b, wt, out, p, ne, n, k, k // 2, stride_x,
                             float(limit), nt, TOPK=topk, UP=int(up), BLOCK_M=block_m, STAGES=stages,
                             SAFE=int(safe), SKIP_PAD=int(skip_pad),
                             KT_PAD=triton.next_power_of_2(triton.cdiv(k // 128, 2)), WORKER_REGS=WS_REGS,
                             num_warps=4, maxnreg=WS_REGS, **pdl_launch())
