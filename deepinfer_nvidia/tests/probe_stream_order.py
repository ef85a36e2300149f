"""Does the order weight bytes are streamed in limit the expert and GEMV loaders? (device probe, twentieth pass)

The swap experts and the FP8 GEMV stream a [64-row, K] tile of a row-major weight matrix one column chunk
(64 or 128 bytes of each of the 64 rows) a step: at any moment the memory sees one short piece from each of many
rows, and each DRAM page (a row's next 2 KB) is opened again every step. This probe reads the same bytes in that
order and in a tiled order (each step one contiguous 64 x CHUNK block, as a pre-tiled layout would store it),
with the same programs, and prints the bandwidth of each against a torch copy.

    python3 -m deepinfer_nvidia.tests.probe_stream_order
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _stream(w_ptr, out_ptr, K, ROWS: tl.constexpr, CH: tl.constexpr, TILED: tl.constexpr):
    """w int32 [tiles * ROWS, K] (K in int32 words); one program a 64-row tile, CH words of each row a step."""
    pid = tl.program_id(0).to(tl.int64)
    r = tl.arange(0, ROWS)
    c = tl.arange(0, CH)
    base = pid * ROWS * K
    acc = tl.zeros([ROWS, CH], dtype=tl.int32)
    for k in range(0, K, CH):
        if TILED:
            offs = base + k * ROWS + r[:, None] * CH + c[None, :]
        else:
            offs = base + r[:, None].to(tl.int64) * K + k + c[None, :]
        acc ^= tl.load(w_ptr + offs)
    tl.store(out_ptr + pid, tl.sum(acc))


def _time(fn, reps=20) -> float:
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    g.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps * 1e-3


def main() -> None:
    src = torch.empty(1 << 28, dtype=torch.int32, device="cuda")
    dst = torch.empty_like(src)
    copy_bw = 2 * src.numel() * 4 / _time(lambda: dst.copy_(src), reps=5)
    print(f"torch copy: {copy_bw / 1e12:.2f} TB/s")
    del src, dst
    for row_bytes, total_mb in ((2048, 113), (2048, 1130), (5120, 42), (5120, 170), (640, 40)):
        k = row_bytes // 4
        rows = (total_mb * 2**20 // row_bytes) // 64 * 64
        w = torch.randint(-2**31, 2**31 - 1, (rows, k), dtype=torch.int32, device="cuda")
        out = torch.empty(rows // 64, dtype=torch.int32, device="cuda")
        nbytes = w.numel() * 4
        line = [f"rows of {row_bytes} B, {nbytes / 1e6:.0f} MB, {rows // 64} programs:"]
        for ch_bytes in (64, 128, 256):
            for tiled in (0, 1):
                for warps, stages in ((4, 3), (4, 5), (8, 4)):
                    ch = ch_bytes // 4
                    if k % ch:
                        continue
                    t = _time(lambda: _stream[(rows // 64,)](w, out, k, ROWS=64, CH=ch, TILED=tiled,
                                                             num_warps=warps, num_stages=stages))
                    line.append(f"{'tiled' if tiled else 'rows'} {ch_bytes}B w{warps}s{stages} "
                                f"{nbytes / t / 1e12:.2f}")
        print(" | ".join(line))
        del w


if __name__ == "__main__":
    main()
