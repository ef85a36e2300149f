"""The paired swap experts' up launch with its work spread evenly over two programs an SM (stream-K).

Why (docs/performance.md, twenty-fifth pass, never built until the forty-first). At one token the up launch has 216
(expert block, 64-row tile) programs of 20 steps each (two 128-column K tiles a step, V4.1's K = 5120) and room for
two programs an SM (94 KB of shared memory, 128 registers a thread), so 84 of the H200's 132 SMs run two programs
and 48 run one. The launch ends when the SMs with two programs have done 40 steps, while the whole launch is 4320
steps: 32.7 an SM if they were spread evenly. The twenty-fifth pass put the cost of that imbalance at ~18% of the
launch; the thirty-seventh found the launch bound neither by bytes nor by issue but by each program's chain, which
this does not change: it only gives every SM the same share of the chains.

Here the launch has ``programs`` (two an SM) programs over the flattened units ``u = tile * S + step`` of the live
tiles (S steps a tile; tiles block-major, blocks with an expert id < E, which ``align_small`` puts first). Program
``p`` takes units ``[p * L, (p + 1) * L)`` with ``L = max(cdiv(U, programs), cdiv(S, 2))``, so a tile meets at most
three programs (``MAX_SEGMENTS``, the partial buffer's depth; ``segments`` is the Python model of the split). Each segment of a tile runs the paired kernel's ring, decode and ``wgmma`` over its steps; a segment
that is the whole tile finishes it (the clamped SwiGLU) at once, otherwise it stores its folded fp32 sums and the
last of the tile's programs to arrive (``cnt``) adds the partials in segment order, from zero, and finishes. So the
result depends only on the split, never on timing (graph replays are bit-identical), and differs from the unsplit
launch's only in the order of the fp32 sums.

Only the up launch: the down launch's 480 programs of 9 steps already fill 1.8 rounds of two an SM, and a segment
restart costs a ring's worth of latency, which its short tiles would pay more often than they gain.
``DEEPINFER_NV_SWAP_PAIR_BALANCED=1`` turns it on (off until a device run says otherwise).
"""
from __future__ import annotations

import os

import torch
import triton

from deepinfer_nvidia.kernels import gluon_moe_swap as _swap
from deepinfer_nvidia.kernels.triton_pdl import pdl_launch

BALANCED = os.environ.get("DEEPINFER_NV_SWAP_PAIR_BALANCED", "0") == "1"
PROGRAMS_PER_SM = 2  # what the paired up kernel's registers and shared memory allow
MAX_SEGMENTS = 3  # a tile's programs (and a program's tiles) at most, since L >= cdiv(S, 2)


def units_per_program(units: int, programs: int, steps: int) -> int:
    """``L``: the units each program takes (the kernel's formula)."""
    return max(-(-units // max(1, programs)), -(-steps // 2), 1)


def segments(units: int, programs: int, steps: int) -> list[list[tuple[int, int, int, int]]]:
    """The Python model of the kernel's split: for each program, its (tile, first step, end step, slot) segments;
    ``slot`` is the segment's index among its tile's segments (where its partial goes). ``units`` = live tiles x
    ``steps``."""
    per = units_per_program(units, programs, steps)
    out = []
    for p in range(programs):
        u0, u1 = min(units, p * per), min(units, (p + 1) * per)
        segs = []
        for tile in range(u0 // steps, (u1 - 1) // steps + 1) if u1 > u0 else ():
            s0, s1 = max(u0 - tile * steps, 0), min(u1 - tile * steps, steps)
            segs.append((tile, s0, s1, p - (tile * steps) // per))
        out.append(segs)
    return out


def takes(up: bool, pairs: int, topk: int) -> bool:
    """Whether the paired path's launch ``up`` of ``pairs`` pairs is spread evenly: the knob, the up launch, and one
    token (``pairs == topk``), where ``num_blocks``' bound less its spare block is the live count (distinct experts),
    so no program is handed an empty block's units."""
    return BALANCED and up and pairs == topk and _swap.available()


if _swap.available():
    from deepinfer_nvidia.kernels import gluon_swap_pair as _pair
    from deepinfer_nvidia.kernels.gluon_api import (
        REINTERPRET_PUBLIC as _REINTERPRET_PUBLIC,
        async_copy,
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
    _grid_dependency = _swap._grid_dependency
    _issue_pair = _pair._issue_pair
    _pair_scales = _pair._pair_scales
    _FRAG_PAIR = gl.constexpr(_swap._fragment_bytes_layout(128, warpgroups=2))

    @gluon.jit
    def _stage_segment_scales(ss, s_ptr, e64, N, KW, tile, s0, n, KT_PAD: gl.constexpr, num_warps: gl.constexpr):
        """Steps ``s0 .. s0 + n - 1``'s scale words of ``tile`` into the preallocated int32 [KT_PAD, 128] ``ss``:
        word [i, 64h + r] is row r's 4 UE8M0 bytes of K tile 2(s0 + i) + h (masked: 0x7f7f7f7f, scale 1.0)."""
        LR: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [num_warps, 1], [1, 0])
        st = gl.expand_dims(gl.arange(0, KT_PAD, layout=gl.SliceLayout(1, LR)), 1)
        q = gl.expand_dims(gl.arange(0, 128, layout=gl.SliceLayout(0, LR)), 0)
        rn = tile * 64 + q % 64
        kt = 2 * (st + s0) + q // 64
        ss.store(gl.load(s_ptr + e64 * N * KW + rn.to(gl.int64) * KW + kt, mask=(st < n) & (kt < KW) & (rn < N),
                         other=0x7F7F7F7F))

    @gluon.jit
    def _rows_view(ss, KT_PAD: gl.constexpr):
        """The [KT_PAD, 128] words as KT_PAD rank-1 rows (``_pair_scales`` reads one)."""
        if _REINTERPRET_PUBLIC:
            return ss.reinterpret(gl.int32, [KT_PAD, 128], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        else:
            return ss._reinterpret(gl.int32, [KT_PAD, 128], gl.SwizzledSharedLayout(1, 1, 1, [0]))

    @gluon.jit
    def _fold_into(buf, acc, BLOCK_M: gl.constexpr, LO: gl.constexpr):
        """``_pair._fold`` through a preallocated buffer (the segment loop reuses it)."""
        _cta_barrier()  # the previous fold's reads are done
        buf.store(acc)
        _cta_barrier()
        even = buf.slice(0, 64, 0).slice(0, BLOCK_M, 1).load(LO)
        odd = buf.slice(64, 64, 0).slice(BLOCK_M, BLOCK_M, 1).load(LO)
        return even + odd

    @gluon.jit
    def _balanced_up_kernel(x_ptr, pair_ptr, bexp_ptr, wa_ptr, sa_ptr, wb_ptr, sb_ptr, out_ptr, part_ptr, cnt_ptr,
                            P, E, N, K, row_bytes, stride_x, limit, NT, NB, TOPK: gl.constexpr,
                            BLOCK_M: gl.constexpr, STAGES: gl.constexpr, SAFE: gl.constexpr, KT_PAD: gl.constexpr,
                            num_warps: gl.constexpr, PDL: gl.constexpr = 0,
                            PACKED: gl.constexpr = 0):
        """``_pair._swap_pair_kernel``'s up launch (the same operands, layouts and output h) over this program's
        units (module docstring); ``part`` [NB * NT, MAX_SEGMENTS, 2, 64, BLOCK_M] fp32, ``cnt`` zeroed int32 a
        tile (reset here), ``NB`` the blocks that can be live (``bexp``'s first ``NB``; the routing's are a prefix)."""
        if PDL:
            _grid_dependency(True)
            _grid_dependency(False)
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
        WORDS: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        pid = gl.program_id(0)
        n_s = gl.cdiv(gl.cdiv(K, 128), 2)
        KG = K // 32
        # units over the blocks that can be live (``NB``, the host's bound: exact at one token), not over the
        # count the routing left: a count read from memory would make every loop bound below non-uniform, and the
        # K loop would pay ~45 instructions a step moving its ring addresses into uniform registers (SASS)
        units = NB * NT * n_s
        per = gl.maximum(gl.cdiv(units, gl.num_programs(0)), gl.cdiv(n_s, 2))
        u0 = gl.minimum(pid * per, units)
        u1 = gl.minimum(u0 + per, units)
        if u0 >= u1:
            return

        ring_a = gl.allocate_shared_memory(gl.uint8, [STAGES, 128, 4, 16], RING)
        ring_b = gl.allocate_shared_memory(gl.uint8, [STAGES, 128, 4, 16], RING)
        ring_x = gl.allocate_shared_memory(gl.bfloat16, [STAGES, 2 * BLOCK_M, 128], SM)
        words_a = gl.allocate_shared_memory(gl.int32, [KT_PAD, 128], WORDS)
        words_b = gl.allocate_shared_memory(gl.int32, [KT_PAD, 128], WORDS)
        ss_a = _rows_view(words_a, KT_PAD)
        ss_b = _rows_view(words_b, KT_PAD)
        fold = gl.allocate_shared_memory(gl.float32, [128, 2 * BLOCK_M], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))

        q = gl.arange(0, 2 * BLOCK_M, layout=gl.SliceLayout(1, LX))
        xk = gl.expand_dims((q // BLOCK_M) * 128, 1) + gl.expand_dims(gl.arange(0, 128, layout=gl.SliceLayout(0, LX)),
                                                                       0)
        q3 = gl.arange(0, 128, layout=gl.SliceLayout(1, LS))
        rg3 = gl.arange(0, 4, layout=gl.SliceLayout(0, LS))
        rb3 = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(0, L3)))
        gcol = gl.expand_dims((q3 // 64) * 4, 1) + gl.expand_dims(rg3, 0)
        gcol3 = gl.expand_dims(gcol, 2)
        rb_off = gl.expand_dims(gl.expand_dims(rb3, 0), 0)
        ro = gl.arange(0, 64, layout=gl.SliceLayout(1, LO))
        co = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, LO))
        poff = gl.expand_dims(ro * BLOCK_M, 1) + gl.expand_dims(co, 0)

        for tg in range(u0 // n_s, (u1 - 1) // n_s + 1):
            s0 = gl.maximum(u0 - tg * n_s, 0)
            s1 = gl.minimum(u1 - tg * n_s, n_s)
            n = s1 - s0
            blk = tg // NT
            tile = tg - blk * NT
            e = gl.load(bexp_ptr + blk)
            live = e < E  # a block the routing left empty: nothing to read or write
            e64 = gl.minimum(e, E - 1).to(gl.int64)
            rows_x = blk * BLOCK_M + q % BLOCK_M
            pair_x = gl.load(pair_ptr + rows_x)
            xoff = gl.expand_dims((pair_x // TOPK).to(gl.int64) * stride_x, 1) + xk
            vx = gl.expand_dims(pair_x < P, 1)
            rn3 = tile * 64 + q3 % 64
            nm3 = gl.expand_dims(gl.expand_dims(rn3 < N, 1), 2)
            woff = gl.expand_dims(e64 * N * row_bytes + rn3.to(gl.int64) * row_bytes, 1) + gcol * 16
            woff3 = gl.expand_dims(woff, 2) + rb_off
            # the copies' K bounds end at the segment's last step (its bytes past it are another program's): step j
            # covers 32-column groups 8j .. 8j + 7 and activation columns 256j .. 256j + 255, so these bounds mask
            # exactly the steps >= s1 with the paired kernel's own comparisons (no extra instruction a step)
            kg_end = gl.where(live, gl.minimum(KG, 8 * s1), 0)
            k_end = gl.where(live, gl.minimum(K, 256 * s1), 0)

            _cta_barrier()  # the previous segment's reads of the rings and words are done
            for jp in gl.static_range(STAGES - 1):
                _issue_pair(ring_a, ring_b, ring_x, wa_ptr, wb_ptr, x_ptr, woff3, nm3, gcol3, xoff, vx, xk, kg_end,
                            k_end, s0 + jp, jp, 1)
            _stage_segment_scales(words_a, sa_ptr, e64, N, KG // 4, tile, s0, n, KT_PAD, num_warps)
            _stage_segment_scales(words_b, sb_ptr, e64, N, KG // 4, tile, s0, n, KT_PAD, num_warps)
            acc_a = warpgroup_mma_init(gl.zeros([128, 2 * BLOCK_M], gl.float32, layout=ACC))
            acc_b = warpgroup_mma_init(gl.zeros([128, 2 * BLOCK_M], gl.float32, layout=ACC))
            _cta_barrier()  # every warp's words are stored before any warp reads them
            ca = _pair_scales(ss_a, 0, rg3, LS)
            cb = _pair_scales(ss_b, 0, rg3, LS)
            for i in range(n):
                acc_a, acc_b = warpgroup_mma_wait(num_outstanding=0, deps=(acc_a, acc_b))
                _cta_barrier()  # every warpgroup's wgmma of step i-1 is done: its ring slot may be refilled
                _issue_pair(ring_a, ring_b, ring_x, wa_ptr, wb_ptr, x_ptr, woff3, nm3, gcol3, xoff, vx, xk, kg_end,
                            k_end, s0 + i + STAGES - 1, (i + STAGES - 1) % STAGES, 1)
                nca = _pair_scales(ss_a, gl.minimum(i + 1, KT_PAD - 1), rg3, LS)  # the last step's read is unused
                ncb = _pair_scales(ss_b, gl.minimum(i + 1, KT_PAD - 1), rg3, LS)
                async_copy.wait_group(STAGES - 1)
                si = i % STAGES
                _cta_barrier()
                xs = ring_x.index(si).permute((1, 0))
                da = gl.convert_layout(_decode_fragment(ring_a.index(si).load(L3), ca, 128, SAFE, PACKED), AOP)
                db = gl.convert_layout(_decode_fragment(ring_b.index(si).load(L3), cb, 128, SAFE, PACKED), AOP)
                fence_async_shared()
                _cta_barrier()
                acc_a = warpgroup_mma(da, xs, acc_a, is_async=True)
                acc_b = warpgroup_mma(db, xs, acc_b, is_async=True)
                ca = nca
                cb = ncb
            async_copy.wait_group(0)
            acc_a, acc_b = warpgroup_mma_wait(num_outstanding=0, deps=(acc_a, acc_b))
            ya = _fold_into(fold, acc_a, BLOCK_M, LO)
            yb = _fold_into(fold, acc_b, BLOCK_M, LO)
            rn = tile * 64 + ro
            rows = blk * BLOCK_M + co
            nmask = gl.expand_dims(rn < N, 1)
            hoff = gl.expand_dims(rows.to(gl.int64) * N, 0) + gl.expand_dims(_frag128(rn), 1)
            if n == n_s:
                _up_finish(ya, yb, out_ptr, hoff, nmask, limit)
            else:
                first = (tg * n_s) // per
                nseg = (tg * n_s + n_s - 1) // per - first + 1
                tile_part = part_ptr + tg.to(gl.int64) * (3 * 2 * 64 * BLOCK_M)
                mine = tile_part + (pid - first) * (2 * 64 * BLOCK_M)
                gl.store(mine + poff, ya)
                gl.store(mine + 64 * BLOCK_M + poff, yb)
                _cta_barrier()
                if gl.atomic_add(cnt_ptr + tg, 1, sem="acq_rel") == nseg - 1:
                    ta = gl.zeros([64, BLOCK_M], gl.float32, layout=LO)
                    tb = gl.zeros([64, BLOCK_M], gl.float32, layout=LO)
                    for sg in range(nseg):  # segment order, from zero: the same bits whoever arrives last
                        src = tile_part + sg * (2 * 64 * BLOCK_M)
                        ta += gl.load(src + poff, cache_modifier=".cg")
                        tb += gl.load(src + 64 * BLOCK_M + poff, cache_modifier=".cg")
                    _up_finish(ta, tb, out_ptr, hoff, nmask, limit)
                    gl.atomic_xchg(cnt_ptr + tg, 0)


def launch_up(x, pair, bexp, w1, s1, w3, s3, h, p: int, ne: int, n: int, k: int, stride_x: int, limit: float,
              nt: int, topk: int, safe: bool, stages: int, sms: int, packed: bool = False) -> None:
    """The balanced up launch: ``gluon_swap_pair.launch(True, ...)``'s operands (byte stacks and UE8M0 bytes; h
    [blocks * 8, n] bf16 written) over ``PROGRAMS_PER_SM * sms`` programs."""
    from deepinfer_nvidia.kernels import gluon_swap_pair as pair_path
    from deepinfer_nvidia.kernels.triton_fp8_gemv import _counters

    nb = bexp.numel()
    bm = pair_path.PAIR_BLOCK_M
    part = torch.empty(nb * nt * MAX_SEGMENTS * 2 * 64 * bm, dtype=torch.float32, device=x.device)
    cnt = _counters(x.device, nb * nt)
    words = [a.view(torch.int32) for a in (s1, s3)]
    _balanced_up_kernel[(PROGRAMS_PER_SM * sms,)](
        x, pair, bexp, w1, words[0], w3, words[1], h, part, cnt, p, ne, n, k, k // 2, stride_x, float(limit), nt,
        max(1, nb - 1),  # num_blocks' bound has one block to spare
        TOPK=topk, BLOCK_M=bm, STAGES=stages, SAFE=int(safe),
        KT_PAD=triton.next_power_of_2(triton.cdiv(k // 128, 2)),
        num_warps=8, maxnreg=pair_path.PAIR_MAXNREG, PACKED=int(packed), **pdl_launch())
