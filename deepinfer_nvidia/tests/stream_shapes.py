"""How fast the GPU streams a GEMV's weight bytes with different per-program tile shapes (thirty-fifth pass; not a
pytest file, no model code).

    python3 -m deepinfer_nvidia.tests.stream_shapes

The wgmma GEMVs read [64 rows, 128 bytes] tiles: every tile is 64 separate 128-byte lines, one per weight row, and a
program walks along K 128 bytes at a time. Both the bf16-decode kernel and the FP8-wgmma one stream at ~1.9 TB/s
on an H100 whatever their instruction count (thirty-fourth and thirty-fifth passes), so the question here is
whether the access shape itself is the limit. A Gluon kernel with the GEMVs' ring (16-byte ``cp.async``,
``STAGES`` slots, one commit group a tile) reads each program's [R, C]-byte tiles along K and sums them (so every
byte is used), for R x C = 8 KB and 16 KB, over one V4.1 layer's GEMV shapes with the bf16 GEMV's program count, in
one CUDA graph over L2-defeating copies. Prints TB/s per shape and the copy bandwidth (``torch`` copy) beside it;
then the same six launches under programmatic dependent launch (as the GEMVs run), with half and twice the
programs, and the layer's bytes read by one launch.
"""
from __future__ import annotations

import torch
import triton

from deepinfer_nvidia.kernels import gluon_moe_swap as _swap
from deepinfer_nvidia.kernels.triton_pdl import gluon_grid_dependency
from deepinfer_nvidia.tests.graph_timing import graph_us

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

_cp_async = _swap._cp_async
_cta_barrier = _swap._cta_barrier
_REINTERPRET_PUBLIC = _swap._REINTERPRET_PUBLIC

# (N, K) of one V4.1 layer's FP8 GEMVs (wo_a as its 8 groups' rows: the same bytes)
SHAPES = [(1792, 5120), (36864, 1280), (8192, 4096), (5120, 8192), (4608, 5120), (5120, 2304)]


@gluon.jit
def _stream_kernel(q_ptr, out_ptr, N, K, k_per_split, R: gl.constexpr, C: gl.constexpr, STAGES: gl.constexpr,
                   num_warps: gl.constexpr, PDL: gl.constexpr = 0):
    """Program (row tile of R rows, K split): sum of its [R, k_per_split] bytes, streamed in [R, C] tiles. PDL (launched
    with programmatic dependent launch): the first tiles are requested before waiting for the previous kernel, as the
    GEMVs do, and the next kernel is released after the loop."""
    TPR: gl.constexpr = C // 16  # threads a row (16 bytes each)
    L: gl.constexpr = gl.BlockedLayout([1, 16], [32 // TPR if TPR < 32 else 1, TPR if TPR < 32 else 32],
                                       [num_warps, 1], [1, 0])
    SL: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    pid_n = gl.program_id(0)
    pid_k = gl.program_id(1)
    k_lo = pid_k * k_per_split
    n_k = gl.cdiv(gl.minimum(k_per_split, K - k_lo), C)
    r = pid_n * R + gl.arange(0, R, layout=gl.SliceLayout(1, L))
    c = gl.arange(0, C, layout=gl.SliceLayout(0, L))
    ptrs = q_ptr + gl.expand_dims(r.to(gl.int64) * K + k_lo, 1) + gl.expand_dims(c, 0)
    mask = gl.expand_dims(r < N, 1)
    ring = gl.allocate_shared_memory(gl.int8, [STAGES, R, C], SL)
    for jp in gl.static_range(STAGES - 1):
        _cp_async(ring.index(jp), ptrs + jp * C, mask=mask & (jp < n_k))
        async_copy.commit_group()
    if PDL:
        gluon_grid_dependency(True)
    # consume as int32 words (one add a 4 bytes): the shared view of the ring as [STAGES, R, C / 4] int32
    LW: gl.constexpr = gl.BlockedLayout([1, 4], [32 // TPR if TPR < 32 else 1, TPR if TPR < 32 else 32],
                                        [num_warps, 1], [1, 0])
    if _REINTERPRET_PUBLIC:
        words = ring.reinterpret(gl.int32, [STAGES, R, C // 4], SL)
    else:
        words = ring._reinterpret(gl.int32, [STAGES, R, C // 4], SL)
    acc = gl.zeros([R, C // 4], gl.int32, layout=LW)
    for i in range(n_k):
        async_copy.wait_group(STAGES - 2)
        _cta_barrier()
        j = i + STAGES - 1
        _cp_async(ring.index(j % STAGES), ptrs + j * C, mask=mask & (j < n_k))
        async_copy.commit_group()
        acc += words.index(i % STAGES).load(LW)
    async_copy.wait_group(0)
    if PDL:
        gluon_grid_dependency(False)
    gl.atomic_add(out_ptr + pid_n, gl.sum(gl.sum(acc, axis=1), axis=0))


def _plan(n: int, k: int, r: int, c: int, programs: int) -> tuple[int, int, int]:
    """(row tiles, splits, K bytes a split) giving about ``programs`` programs."""
    tiles = triton.cdiv(n, r)
    split = max(1, min(k // c, round(programs / tiles)))
    per = triton.cdiv(triton.cdiv(k, split), c) * c
    return tiles, triton.cdiv(k, per), per


def main() -> None:
    from deepinfer_nvidia.kernels import gluon_fp8_gemv as gg

    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    layer = [torch.randint(-8, 8, (n, k), dtype=torch.int8, device=dev) for n, k in SHAPES]
    mb = sum(w.numel() for w in layer) / 1e6
    copies = max(2, -(-300 // int(mb)))
    ring = [[w.clone() for w in layer] for _ in range(copies)]
    out = torch.zeros(1 << 16, dtype=torch.int32, device=dev)
    big = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    copy_us = graph_us(lambda: big[: 1 << 29].copy_(big[1 << 29:]), warmup=5, rep=40)
    print(f"copy bandwidth: {2 * (1 << 29) / copy_us / 1e6:.2f} TB/s; layer {mb:.0f} MB x {copies} copies", flush=True)
    programs = [gg.launch_plan(1, n, k, sms, 3)[0] * gg.launch_plan(1, n, k, sms, 3)[3] for n, k in SHAPES]
    for r, c, stages, warps in [(64, 128, 3, 4), (64, 128, 4, 4), (32, 256, 3, 4), (16, 512, 3, 4), (8, 1024, 3, 4),
                                (64, 256, 3, 4), (32, 512, 3, 4), (16, 1024, 3, 4), (64, 128, 3, 8), (32, 256, 3, 8)]:
        plans = [_plan(n, k, r, c, p) for (n, k), p in zip(SHAPES, programs)]

        def run():
            for copy in ring:
                for w, (n, k), (tiles, split, per) in zip(copy, SHAPES, plans):
                    _stream_kernel[(tiles, split)](w, out, n, k, per, R=r, C=c, STAGES=stages, num_warps=warps)

        us = graph_us(run, warmup=5, rep=40) / copies
        print(f"tile [{r:2d} rows, {c:4d} B] stages {stages} warps {warps}: layer {us:6.1f} us, {mb / us:4.2f} TB/s "
              f"(programs {sum(t * s for t, s, _ in plans)})", flush=True)
    # the launches' share: the same six launches with half and twice the programs, then the layer's bytes as one
    # launch (one [rows, 8192]-byte matrix) at the same total program count and at a quarter of it
    plans = [_plan(n, k, 64, 128, p) for (n, k), p in zip(SHAPES, programs)]

    def with_pdl():
        for copy in ring:
            for w, (n, k), (tiles, split, per) in zip(copy, SHAPES, plans):
                _stream_kernel[(tiles, split)](w, out, n, k, per, R=64, C=128, STAGES=3, num_warps=4, PDL=1,
                                               launch_pdl=True)

    us = graph_us(with_pdl, warmup=5, rep=40) / copies
    print(f"six launches under PDL (first tiles before the wait): layer {us:6.1f} us, {mb / us:4.2f} TB/s", flush=True)
    for scale in (0.5, 2.0):
        plans = [_plan(n, k, 64, 128, max(1, int(p * scale))) for (n, k), p in zip(SHAPES, programs)]

        def scaled():
            for copy in ring:
                for w, (n, k), (tiles, split, per) in zip(copy, SHAPES, plans):
                    _stream_kernel[(tiles, split)](w, out, n, k, per, R=64, C=128, STAGES=3, num_warps=4)

        us = graph_us(scaled, warmup=5, rep=40) / copies
        print(f"six launches, x{scale} programs ({sum(t * s for t, s, _ in plans)}): layer {us:6.1f} us, "
              f"{mb / us:4.2f} TB/s", flush=True)
    flat = [torch.cat([w.view(-1) for w in copy])[: int(mb * 1e6) // 8192 * 8192].view(-1, 8192) for copy in ring]
    rows = flat[0].shape[0]
    for total in (sum(programs), sum(programs) // 4, sms * 4):
        tiles, split, per = _plan(rows, 8192, 64, 128, total)

        def one():
            for f in flat:
                _stream_kernel[(tiles, split)](f, out, rows, 8192, per, R=64, C=128, STAGES=3, num_warps=4)

        us = graph_us(one, warmup=5, rep=40) / copies
        print(f"one launch, {tiles * split} programs: layer {us:6.1f} us, {mb / us:4.2f} TB/s", flush=True)


if __name__ == "__main__":
    main()
