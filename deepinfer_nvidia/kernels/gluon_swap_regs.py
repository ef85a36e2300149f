"""The paired swap experts with the weights loaded straight into registers: no shared-memory ring, no barrier a step.

Why (docs/performance.md, thirty-ninth pass). At one token the paired kernel (``gluon_swap_pair``) moves V4.1's
MXFP4 experts at ~1.8-1.9 TB/s on both the H100 and the H200, and its loader alone (16-byte ``cp.async`` into a
3-stage ring, the CTA barriers around each slot; no decode, no ``wgmma``) ran at the same rate in the nineteenth
pass. A plain loop of register loads over the same bytes, with 8-warp programs at ~1.7 programs an SM, read
3.4 TB/s on the H200 (twenty-first pass, ``pass21c/probe.txt``). Nsight Compute (thirty-eighth pass) found the
paired kernel's two warpgroups meeting at three CTA barriers a step, so they decode together and wait together.

Here each thread loads exactly the bytes of its own ``wgmma`` A fragment (``_FRAG_PAIR``: rows 16w + r and
16w + r + 8 of its warpgroup's 64, bytes 16c .. 16c + 15 of a 64-byte K tile, ``LDG.128``) ``DEPTH`` steps ahead
into registers, with its rows' scale words; nothing a thread loads is read by another, so the K loop has no
barrier at all. The activations (the block's 8 pairs over all of K, both tiles of a step side by side: [XS, 16, 128]
bf16) are copied into shared memory once in the prologue, behind one barrier, and every step's ``wgmma`` reads its
slice. The step's arithmetic is the paired kernel's: the same decode (``_decode_fragment``), the same m64n16
``wgmma`` per warpgroup in the same K order, the same fold of the two halves (even tiles' sum + odd tiles'), the
same epilogues, so the outputs are the paired kernel's bits (device test ``test_swap_regs_equals_pair``).

Shared memory: ``XS`` x 4 KB of activations (80 KB for V4.1's up launch, 36 KB for the down) and the 8 KB fold,
so two programs an SM as before. Registers: one step's raw bytes a matrix are 8 a thread, its decoded fragment 32.
Opt-in until measured: ``DEEPINFER_NV_SWAP_PAIR_REGS=1`` (``gluon_swap_pair.launch`` takes it where ``fits``).
"""
from __future__ import annotations

import os

import torch
import triton

from deepinfer_nvidia.kernels import gluon_swap_pair as _pair
from deepinfer_nvidia.kernels.mxfp4_word_decode import _word_asm
from deepinfer_nvidia.kernels.triton_pdl import pdl_launch

# Steps whose weight words are in flight ahead of the one being decoded (1 or 2), for the up and the down launch.
# The up launch at 2 spills inside its K loop under the 128-register cap (16 more registers: w1 and w3 of one more
# step); the down launch fits either. ``DEEPINFER_NV_SWAP_REGS_DEPTH=UP,DOWN``.
REGS_DEPTH_UP, REGS_DEPTH_DOWN = (int(v) for v in os.environ.get("DEEPINFER_NV_SWAP_REGS_DEPTH", "1,1").split(","))
# Weight and scale loads cached in L2 only (``ld.global.cg``, as the ring's 16-byte ``cp.async`` bypasses L1) instead of
# allocating L1 lines. ``DEEPINFER_NV_SWAP_REGS_CG=0``: the default loads.
REGS_CG = os.environ.get("DEEPINFER_NV_SWAP_REGS_CG", "1") == "1"
# Activation steps a program may hold in shared memory (4 KB each): 24 keeps two programs an SM (96 + 8 KB).
REGS_MAX_STEPS = 24

if _pair._GLUON:
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

    def _fragment_words_layout():
        """``gluon_swap_pair``'s fragment bytes ([128, 4, 16] uint8, two warpgroups) as int32 words [128, 4, 4]:
        warp w, lane (r = lane // 4, c = lane % 4) holds words 4c..4c+3 (bytes 16c..16c+15) of rows 16w + r and
        16w + r + 8 (warps 4-7: rows 64-127)."""
        return gl.DistributedLinearLayout(reg_bases=[[0, 0, 1], [0, 0, 2], [8, 0, 0]],
                                          lane_bases=[[0, 1, 0], [0, 2, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
                                          warp_bases=[[16, 0, 0], [32, 0, 0], [64, 0, 0]], block_bases=[],
                                          shape=[128, 4, 4])

    _FRAG_WORDS = gl.constexpr(_fragment_words_layout())
    # the word decoder with its word given twice (a two-element pack of ``gl.join(w, w)``): the scale is $6
    _ASM_SAFE_W = gl.constexpr(_word_asm(True, scale=6))
    _ASM_FAST_W = gl.constexpr(_word_asm(False, scale=6))
    _fold = _pair._fold
    _frag128 = _pair._frag128
    _up_finish = _pair._up_finish
    _down_finish = _pair._down_finish
    _grid_dependency = _pair._grid_dependency

    @gluon.jit
    def _load_step(wa_ptr, wb_ptr, sa_ptr, sb_ptr, woff3, nm3, gcol3, soff, sq, smask, KG, KW, j,
                   UP: gl.constexpr, CACHE: gl.constexpr):
        """Step ``j``'s fragment words (K tiles 2j and 2j + 1: [128, 4, 4] int32, row 64h + r of tile 2j + h) and
        scale words ([128] int32) of both matrices (the second is the first's when not UP); steps past K load
        nothing (zeros, and scale words 0x7f7f7f7f)."""
        gm = j * 8 + gcol3 < KG
        a = gl.load(wa_ptr + woff3 + j * 32, mask=nm3 & gm, other=0, cache_modifier=CACHE)
        kt = 2 * j + sq // 64
        sm = smask & (kt < KW)
        sa = gl.load(sa_ptr + soff + kt, mask=sm, other=0x7F7F7F7F, cache_modifier=CACHE)
        if UP:
            b = gl.load(wb_ptr + woff3 + j * 32, mask=nm3 & gm, other=0, cache_modifier=CACHE)
            sb = gl.load(sb_ptr + soff + kt, mask=sm, other=0x7F7F7F7F, cache_modifier=CACHE)
        else:
            b = a
            sb = sa
        return a, b, sa, sb

    @gluon.jit
    def _decode_words(w, sc, SAFE: gl.constexpr):
        """``gluon_moe_swap._decode_fragment`` of int32 words: ``w [128, 4, 4]`` (``_FRAG_WORDS``; word j of (row, g)
        is bytes 4j..4j+3 of its 16), ``sc [128, 4, 1]`` UE8M0 -> the same [128, 128] bf16 in the same order. The
        words stay int32 until the decoder's inline PTX reads them: carried across the K loop as bytes, every byte
        sat in its own register and was packed again (~120 PRMT a step)."""
        s16 = sc.to(gl.int16)
        if SAFE:  # 2^(s-127) as bf16 bits (s = 0: the subnormal 2^-127)
            bits = gl.where(s16 == 0, 64, s16 << 7)
            asm: gl.constexpr = _ASM_SAFE_W
        else:  # 2^(s-1) = scale * 2^126, valid for s <= 128 (checked by the wrapper)
            bits = (s16 + 126) << 7
            asm: gl.constexpr = _ASM_FAST_W
        scale = gl.broadcast(bits.to(gl.bfloat16, bitcast=True), w)[0]
        # registers (e0, e4), (e1, e5), (e2, e6), (e3, e7) of each word, as [.., word, half]
        r0, r1, r2, r3 = gl.inline_asm_elementwise(asm, "=r,=r,=r,=r,r,r,r", [gl.join(w, w), gl.join(scale, scale)],
                                                   dtype=(gl.bfloat16, gl.bfloat16, gl.bfloat16, gl.bfloat16),
                                                   is_pure=True, pack=2)
        # byte-decoder order: per word, o0 holds nibbles (0, 4, 1, 5) and o1 (2, 6, 3, 7)
        o0 = gl.join(r0, r1).permute(0, 1, 2, 4, 3).reshape([128, 4, 16])
        o1 = gl.join(r2, r3).permute(0, 1, 2, 4, 3).reshape([128, 4, 16])
        j = gl.join(o0, o1).reshape([128, 4, 4, 2, 2, 2])  # (c, q, p, e, S)
        return j.permute(0, 2, 5, 3, 1, 4).reshape([128, 128])  # (q, S, p, c, e)

    @gluon.jit
    def _word_bytes(w, rg3):
        """Scale words [128] -> the fragment's scale bytes [128, 4, 1] uint8 (byte g of a row's word: group g)."""
        w2 = gl.expand_dims(w, 1)
        return gl.expand_dims(((w2 >> (8 * gl.expand_dims(rg3, 0))) & 255).to(gl.uint8), 2)

    @gluon.jit
    def _swap_regs_kernel(x_ptr, pair_ptr, bexp_ptr, wa_ptr, sa_ptr, wb_ptr, sb_ptr, wt_ptr, out_ptr, P, E, N, K,
                          row_words, stride_x, limit, NT, TOPK: gl.constexpr, UP: gl.constexpr,
                          BLOCK_M: gl.constexpr, SAFE: gl.constexpr, SKIP_PAD: gl.constexpr, XS: gl.constexpr,
                          DEPTH: gl.constexpr, num_warps: gl.constexpr, PDL: gl.constexpr = 0,
                          CACHE: gl.constexpr = ".cg"):
        """``gluon_swap_pair._swap_pair_kernel``'s (expert block, 64-row tile) with its arguments (less the ring's),
        weights by register loads ``DEPTH`` steps ahead. ``XS``: the steps, cdiv(K / 128, 2) (the shared
        activation buffer's depth)."""
        if PDL:  # programmatic dependent launch (triton_pdl): wait for the previous kernel, release the next
            _grid_dependency(True)
            _grid_dependency(False)
        gl.static_assert(num_warps == 8)
        gl.static_assert(DEPTH == 1 or DEPTH == 2)
        L3: gl.constexpr = _FRAG_WORDS
        LS: gl.constexpr = gl.SliceLayout(2, L3)
        LX: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [num_warps, 1], [1, 0])
        ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, 2 * BLOCK_M, 16])
        AOP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=ACC, k_width=2)
        SM: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        LO: gl.constexpr = gl.BlockedLayout([1, 1], [32 // BLOCK_M, BLOCK_M], [num_warps, 1], [1, 0])
        pid = gl.program_id(0)
        tile = pid % NT
        blk = pid // NT
        e = gl.load(bexp_ptr + blk)
        if e >= E:
            return
        e64 = e.to(gl.int64)
        KG = K // 32
        KW = KG // 4
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
        xs_all = gl.allocate_shared_memory(gl.bfloat16, [XS, 2 * BLOCK_M, 128], SM)
        for j in range(XS):  # every step's activations, one commit group
            _cp_async(xs_all.index(j), x_ptr + xoff + j * 256, mask=vx & (j * 256 + xk < K))
        async_copy.commit_group()
        # weight fragment rows: 64h + r is row r of the tile, read at K tile 2i + h (group column 4h + g)
        q3 = gl.arange(0, 128, layout=gl.SliceLayout(1, LS))
        rn3 = tile * 64 + q3 % 64
        rg3 = gl.arange(0, 4, layout=gl.SliceLayout(0, LS))
        rw3 = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(0, L3)))
        nm3 = gl.expand_dims(gl.expand_dims(rn3 < N, 1), 2)
        gcol = gl.expand_dims((q3 // 64) * 4, 1) + gl.expand_dims(rg3, 0)
        gcol3 = gl.expand_dims(gcol, 2)
        woff = gl.expand_dims(e64 * N * row_words + rn3.to(gl.int64) * row_words, 1) + gcol * 4
        woff3 = gl.expand_dims(woff, 2) + gl.expand_dims(gl.expand_dims(rw3, 0), 0)
        # scale words (int32 [E, N, KW]): row rn3's word of K tile 2i + q3 // 64
        soff = e64 * N * KW + rn3.to(gl.int64) * KW
        smask = rn3 < N
        acc_a = warpgroup_mma_init(gl.zeros([128, 2 * BLOCK_M], gl.float32, layout=ACC))
        if UP:
            acc_b = warpgroup_mma_init(gl.zeros([128, 2 * BLOCK_M], gl.float32, layout=ACC))
        a0, b0, s0, t0 = _load_step(wa_ptr, wb_ptr, sa_ptr, sb_ptr, woff3, nm3, gcol3, soff, q3, smask, KG, KW, 0,
                                    UP, CACHE)
        if DEPTH == 2:
            a1, b1, s1, t1 = _load_step(wa_ptr, wb_ptr, sa_ptr, sb_ptr, woff3, nm3, gcol3, soff, q3, smask, KG, KW,
                                        1, UP, CACHE)
        async_copy.wait_group(0)
        fence_async_shared()
        _cta_barrier()  # every warp's activation copies are in shared memory before any wgmma reads them
        for i in range(XS):  # XS == n_s, a constant: no zero-trip path (whose accumulator moves serialise the wgmma)
            # the bytes of step i + DEPTH fly while step i decodes (past the last step: masked, nothing read)
            na, nb, ns, nt = _load_step(wa_ptr, wb_ptr, sa_ptr, sb_ptr, woff3, nm3, gcol3, soff, q3, smask, KG, KW,
                                        i + DEPTH, UP, CACHE)
            if UP:
                acc_a, acc_b = warpgroup_mma_wait(num_outstanding=0, deps=(acc_a, acc_b))
            else:
                acc_a = warpgroup_mma_wait(num_outstanding=0, deps=(acc_a,))
            xs = xs_all.index(i).permute((1, 0))
            # both matrices decoded before either wgmma: a decode between them serialises every wgmma (ptxas C7515)
            da = gl.convert_layout(_decode_words(a0, _word_bytes(s0, rg3), SAFE), AOP)
            if UP:
                db = gl.convert_layout(_decode_words(b0, _word_bytes(t0, rg3), SAFE), AOP)
            acc_a = warpgroup_mma(da, xs, acc_a, is_async=True)
            if UP:
                acc_b = warpgroup_mma(db, xs, acc_b, is_async=True)
            if DEPTH == 2:
                a0, b0, s0, t0 = a1, b1, s1, t1
                a1, b1, s1, t1 = na, nb, ns, nt
            else:
                a0, b0, s0, t0 = na, nb, ns, nt
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



def steps(k: int) -> int:
    """K steps of a launch (two 128-column K tiles each) over K columns."""
    return triton.cdiv(triton.cdiv(k, 128), 2)


def fits(k: int) -> bool:
    """Whether a launch over K columns keeps its activations in shared memory (``REGS_MAX_STEPS``)."""
    return steps(k) <= REGS_MAX_STEPS


def launch(up: bool, grid: int, x, pair, bexp, w, words, wb, words_b, wt, out, p: int, ne: int, n: int, k: int,
           stride_x: int, limit: float, nt: int, topk: int, safe: bool, skip_pad: bool, block_m: int,
           maxnreg: int, depth: int | None = None) -> None:
    """One launch of ``_swap_regs_kernel`` with ``gluon_swap_pair.launch``'s arguments (the scale stacks as int32
    words ``words`` / ``words_b``)."""
    w32, wb32 = w.view(torch.int32), wb.view(torch.int32)  # 8 e2m1 values a word
    _swap_regs_kernel[(grid,)](x, pair, bexp, w32, words, wb32, words_b, wt, out, p, ne, n, k, k // 8, stride_x,
                               float(limit), nt, TOPK=topk, UP=int(up), BLOCK_M=block_m, SAFE=int(safe),
                               SKIP_PAD=int(skip_pad), XS=steps(k),
                               DEPTH=depth or (REGS_DEPTH_UP if up else REGS_DEPTH_DOWN), num_warps=8,
                               maxnreg=maxnreg, CACHE=".cg" if REGS_CG else "", **pdl_launch())
