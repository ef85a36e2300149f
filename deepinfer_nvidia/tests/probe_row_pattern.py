"""Diagnostic (not a pytest file): is the swap experts' weight read slowed by its DRAM access pattern?

    python -m deepinfer_nvidia.tests.probe_row_pattern

The paired swap kernel (``gluon_swap_pair``) has each program walk 64 weight rows together, 128 bytes of each row a
step (rows ``row_bytes`` apart: 2560 for V4.1's w1 / w3, 1152 for w2). This reads the same bytes of the six routed
experts two ways with one plain Triton kernel that only XORs them (no decode, no MMA):

- ``rows``: the kernel's order (64 rows x 128 bytes a step, rows ``row_bytes`` apart);
- ``rows`` at 256 and 512 bytes of a row a step where they divide the row (fewer, longer runs a row);
- ``tiles``: the same bytes repacked so each program's step is one contiguous 8 KB block
  (``[E, N / 64, steps, 64, 128]``), the layout a load-time repack would give.

Both reductions are checked equal (the repack is a permutation), and each is timed from a CUDA graph, with the
device's copy bandwidth (``torch`` clone of the same bytes) in the same run as the baseline. If ``rows`` reads at
the swap kernel's ~1.9 TB/s and ``tiles`` near the copy bandwidth, the pattern is the bound and a repack pays.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_nvidia.tests.graph_timing import graph_us


@triton.jit
def _xor_rows_kernel(w_ptr, ids_ptr, out_ptr, N, row_bytes, NT, STEPS, TILES: tl.constexpr,
                     BR: tl.constexpr, BC: tl.constexpr):
    """Program (expert slot, 64-row tile): XOR of its rows' bytes as int32 words, in ``STEPS`` steps of
    ``BC`` bytes; ``TILES``: the repacked layout [E, NT, STEPS, BR, BC]."""
    pid = tl.program_id(0)
    tile = pid % NT
    e = tl.load(ids_ptr + pid // NT).to(tl.int64)
    r = tl.arange(0, BR)[:, None]
    c = tl.arange(0, BC // 4)[None, :]
    acc = tl.zeros([BR, BC // 4], tl.int32)
    base = e * N * (row_bytes // 4)
    for j in range(STEPS):
        if TILES:
            off = base + ((tile * STEPS + j) * BR + r) * (BC // 4) + c
        else:
            off = base + (tile * BR + r) * (row_bytes // 4) + j * (BC // 4) + c
        acc ^= tl.load(w_ptr + off)
    tl.store(out_ptr + pid, tl.reduce(acc, None, _xor))


@triton.jit
def _xor(a, b):
    return a ^ b


def repack(w: torch.Tensor, br: int = 64, bc: int = 128) -> torch.Tensor:
    """uint8 [E, N, K2] -> the same bytes as [E, N / br, K2 / bc, br, bc] (contiguous)."""
    e, n, k2 = w.shape
    return w.view(e, n // br, br, k2 // bc, bc).permute(0, 1, 3, 2, 4).contiguous()


def xor_read(w: torch.Tensor, ids: torch.Tensor, n: int, row_bytes: int, tiles: bool, warps: int = 8,
             stages: int = 3, width: int = 128) -> torch.Tensor:
    """The XOR of every routed program's bytes: int32 [len(ids) * n / 64]; ``width``: bytes of a row a step (the
    rows order; it must divide ``row_bytes``; the tiles layout is repacked at 128)."""
    nt, steps = n // 64, row_bytes // width
    out = torch.empty(ids.numel() * nt, dtype=torch.int32, device=w.device)
    _xor_rows_kernel[(ids.numel() * nt,)](w.view(torch.int32), ids, out, n, row_bytes, nt, steps, TILES=int(tiles),
                                          BR=64, BC=width, num_warps=warps, num_stages=stages)
    return out


def main() -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    E, D, F = 384, 5120, 2304
    copy_src = torch.empty(6 * 3 * F * D // 2, dtype=torch.uint8, device="cuda")
    copy_us = graph_us(lambda: copy_src.clone(), warmup=20, rep=100, mode="mean")
    copy_tbs = 2 * copy_src.numel() / copy_us / 1e6
    print(f"copy (read + write) {copy_src.numel() / 1e6:.1f} MB: {copy_us:.1f} us = {copy_tbs:.2f} TB/s", flush=True)
    for name, n, k in (("w1/w3-like (up)", F, D), ("w2-like (down)", D, F)):
        w = torch.randint(0, 256, (E, n, k // 2), generator=g, device="cuda", dtype=torch.uint8)
        wt = repack(w)
        for experts in (6, 12, 48):
            ids = torch.randperm(E, generator=g, device="cuda")[:experts].to(torch.int32)
            a, b = xor_read(w, ids, n, k // 2, False), xor_read(wt, ids, n, k // 2, True)
            wide = [v for v in (256, 512) if (k // 2) % v == 0]
            same_wide = all(torch.equal(a.view(-1), xor_read(w, ids, n, k // 2, False, width=v)) for v in wide)
            mb = experts * n * k / 2 / 1e6
            line = f"{name} {experts:3d} experts {mb:7.1f} MB, same XOR: {torch.equal(a, b) and same_wide}"
            for tiles in (False, True):
                for warps, stages in ((4, 3), (8, 3), (8, 4)):
                    us = graph_us(lambda: xor_read(w if not tiles else wt, ids, n, k // 2, tiles, warps, stages),
                                  warmup=20, rep=100, mode="mean")
                    line += f" | {'tiles' if tiles else 'rows'} w{warps}s{stages} {us:6.1f} us {mb / us:4.2f} TB/s"
            for v in wide:
                us = graph_us(lambda: xor_read(w, ids, n, k // 2, False, 8, 3, v), warmup=20, rep=100, mode="mean")
                line += f" | rows {v} B a step w8s3 {us:6.1f} us {mb / us:4.2f} TB/s"
            print(line, flush=True)


if __name__ == "__main__":
    main()
