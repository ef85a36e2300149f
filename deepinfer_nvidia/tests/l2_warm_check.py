"""Would warming L2 with a GEMV's weights during the small kernels before it pay? (thirty-fifth pass; not a pytest
file, no model code.)

    python3 -m deepinfer_nvidia.tests.l2_warm_check [--filler 20]

``stream_shapes`` showed a plain streaming loop with the GEMVs' launch shapes reads one V4.1 layer's GEMV weights at
~2.1 TB/s on an H100 whatever the tile shape: the launches are short (2-47 MB, ~50 KB a program), so each one's ramp
and drain cost as much as the bytes. DRAM sits idle meanwhile through the step's small kernels (norms, RoPE,
attention, top-k: over a third of the batch-1 step). Here, for each of one V4.1 layer's FP8 GEMVs at one row (the
bf16 wgmma kernel), in CUDA graphs:

- ``cold``: ``filler`` small kernels (RMSNorm launches of one 5120-wide row), then the GEMV on weights not in L2;
- ``warm``: the same, with a kernel on a second stream (forked before the filler, joined before the GEMV) asking L2
  for the GEMV's weight bytes (``cp.async.bulk.prefetch.L2``, 4 KB a thread);
- ``filler``: the small kernels alone; and the GEMV alone, cold.

Prints us for each and the GEMV's share (``step - filler``) cold and warm. Weights rotate over enough copies that
nothing stays in L2 from one replay to the next.
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from deepinfer_nvidia.kernels.l2_prefetch import prefetch_asm
from deepinfer_nvidia.tests.graph_timing import graph_us
from deepinfer_nvidia.tests.prefetch_check import LAYER

CHUNK = 4096  # bytes a thread asks L2 for


@triton.jit
def _warm_kernel(ptr, nbytes, CHUNK: tl.constexpr, ASM: tl.constexpr):
    """Ask L2 for bytes [p * 128 * CHUNK, ...) of ``ptr``: one bulk request of CHUNK bytes a thread."""
    off = (tl.program_id(0) * 128 + tl.arange(0, 128)).to(tl.int64) * CHUNK
    tl.inline_asm_elementwise(ASM, "=r,l,r", [ptr + off, (off < nbytes).to(tl.int32)], dtype=tl.int32,
                              is_pure=False, pack=1)


def warm(t: torch.Tensor) -> None:
    """Ask L2 for all of ``t``'s bytes (a multiple of 16; the tail past the last whole chunk is left out)."""
    n = t.numel() * t.element_size()
    _warm_kernel[(triton.cdiv(n // CHUNK, 128),)](t.view(torch.uint8), n - n % CHUNK, CHUNK=CHUNK,
                                                   ASM=prefetch_asm(CHUNK), num_warps=4)


def main() -> None:
    from deepinfer_core.kernels.ops.quant import quant_fp8_block
    from deepinfer_nvidia.kernels import gluon_fp8_gemv as gg, triton_gemm as tg
    from deepinfer_nvidia.kernels.triton_norm import rms as nv_rms

    ap = argparse.ArgumentParser()
    ap.add_argument("--filler", type=int, default=20)
    args = ap.parse_args()
    dev = torch.device("cuda")
    sms = tg._sm_count(dev)
    g = torch.Generator().manual_seed(0)
    side = torch.cuda.Stream()
    xn = torch.randn(1, 5120, generator=g).bfloat16().cuda()
    nw = torch.ones(5120, dtype=torch.bfloat16, device=dev)

    def filler():
        for _ in range(args.filler):
            nv_rms(xn, nw, 1e-6)

    fill_us = graph_us(filler, warmup=5, rep=40)
    print(f"filler: {args.filler} RMSNorm launches {fill_us:.1f} us", flush=True)
    for name, n, k, groups in LAYER:
        q, s = quant_fp8_block(torch.randn(n, k, generator=g) / k ** 0.5, (32, 32), "ue8m0")
        copies = max(3, -(-240 // (q.numel() // (1 << 20))))
        ws = [(q.cuda(), s.view(torch.uint8).contiguous().cuda()) for _ in range(copies)]
        x = torch.randn(1, k * groups, generator=g).bfloat16().cuda()
        ng = n // groups if groups > 1 else None

        def gemv(w):
            return gg.gemv_wgmma(x, w[0], w[1], w[1].shape[1], 32, 32, sms, ng=ng)

        def cold():
            for w in ws:
                filler()
                gemv(w)

        def warmed():
            for w in ws:
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    warm(w[0])
                filler()
                torch.cuda.current_stream().wait_stream(side)
                gemv(w)

        def alone():
            for w in ws:
                gemv(w)

        g_us = graph_us(alone, warmup=5, rep=40) / copies
        c_us = graph_us(cold, warmup=5, rep=40) / copies
        w_us = graph_us(warmed, warmup=5, rep=40) / copies
        mb = q.numel() / 1e6
        print(f"{name:16s} {mb:5.1f} MB: GEMV alone {g_us:6.1f} us ({mb / g_us:4.2f} TB/s); filler + GEMV cold "
              f"{c_us:6.1f} (GEMV {c_us - fill_us:6.1f}), warmed {w_us:6.1f} (GEMV {w_us - fill_us:6.1f}); "
              f"saved {c_us - w_us:5.1f} us", flush=True)


if __name__ == "__main__":
    main()
