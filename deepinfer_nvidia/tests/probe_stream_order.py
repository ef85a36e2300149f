"""Does the order weight bytes are streamed in limit the expert and GEMV loaders? (device probe, twentieth pass)

The swap experts and the FP8 GEMV stream a [64-row, K] tile of a row-major weight matrix one column chunk
(64 or 128 bytes of each of the 64 rows) a step: at any moment the memory sees one short piece from each of many
rows, and each DRAM page (a row's next 2 KB) is opened again every step. This probe reads the same bytes in that
order and in a tiled order (each step one contiguous 64 x CHUNK block, as a pre-tiled layout would store it),
with the same programs, and prints the bandwidth of each against a torch copy.

Measured (pass20g): 3.3-4.1 TB/s over 118 MB in either order, while the swap experts move the same bytes at
~1.4 TB/s. ``--rows`` then asks whether the count of programs is what differs: the swap launch at 1 token has
192 programs (6 experts x 32 tiles, each streaming two 64-row matrices), this probe 904 with 64 rows each;
``--rows 128,256`` gives each program 2x / 4x the rows (452 / 226 programs over the same bytes).

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
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="64", help="rows a program streams (64, 128, 256: fewer programs)")
    ap.add_argument("--stages", default="3,5", help="num_stages values (4 warps)")
    args = ap.parse_args()
    rows_list = [int(r) for r in args.rows.split(",")]
    stages_list = [int(s) for s in args.stages.split(",")]
    src = torch.empty(1 << 28, dtype=torch.int32, device="cuda")
    dst = torch.empty_like(src)
    copy_bw = 2 * src.numel() * 4 / _time(lambda: dst.copy_(src), reps=5)
    print(f"torch copy: {copy_bw / 1e12:.2f} TB/s")
    del src, dst
    for row_bytes, total_mb in ((2048, 113), (2048, 1130), (5120, 170)):  # 42-44 MB sets fit in the 50 MB L2
        k = row_bytes // 4
        for rows_per in rows_list:
            rows = (total_mb * 2**20 // row_bytes) // rows_per * rows_per
            w = torch.randint(-2**31, 2**31 - 1, (rows, k), dtype=torch.int32, device="cuda")
            out = torch.empty(rows // rows_per, dtype=torch.int32, device="cuda")
            nbytes = w.numel() * 4
            line = [f"rows of {row_bytes} B, {nbytes / 1e6:.0f} MB, {rows // rows_per} programs of {rows_per} rows:"]
            for ch_bytes in (64, 128):
                for tiled in (0, 1):
                    for warps, stages in [(4, st) for st in stages_list] + [(8, 4)]:
                        ch = ch_bytes // 4
                        t = _time(lambda: _stream[(rows // rows_per,)](w, out, k, ROWS=rows_per, CH=ch, TILED=tiled,
                                                                       num_warps=warps, num_stages=stages))
                        line.append(f"{'tiled' if tiled else 'rows'} {ch_bytes}B w{warps}s{stages} "
                                    f"{nbytes / t / 1e12:.2f}")
            print(" | ".join(line))
            del w

if __name__ == "__main__":
    main()
