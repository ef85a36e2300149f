"""Diagnostic (not a pytest file): does the paired swap's down launch change with its register cap at one token?

    python -m deepinfer_nvidia.tests.probe_down_cap [--caps 128,64,128,64] [--tokens 1] [--eager N]

For each cap (``gluon_swap_pair.PAIR_DOWN_MAXNREG``, read at launch) the V4.1-shaped MXFP4 experts call
(``swap_mxfp4(paired=True)``) is replayed from a CUDA graph under torch.profiler: per-kernel GPU times in launch
order, then each compiled ``_swap_pair_kernel`` variant's registers, spills and shared memory, and the programs
an SM those allow (256 threads a program, 64K registers and 228 KB an SM), so a flat timing can be told from a cap that never applied.
"""
from __future__ import annotations

import argparse

import torch

from deepinfer_nvidia.tests.bench_swap import _profile_kernels, v41_cases


def _compiled_variants(fn) -> list:
    """The CompiledKernel objects a JIT function holds (Triton 3.6's ``device_caches``); [] where unknown."""
    found = []
    for entry in getattr(fn, "device_caches", {}).values():
        cache = entry[0] if isinstance(entry, tuple) else entry
        if isinstance(cache, dict):
            found.extend(cache.values())
    return found


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--caps", default="128,64,128,64")
    ap.add_argument("--tokens", default="1")
    ap.add_argument("--eager", type=int, default=0, help="N plain calls a cap, nothing timed (for ncu)")
    args = ap.parse_args()
    import deepinfer_nvidia.kernels.gluon_moe_swap as sw
    import deepinfer_nvidia.kernels.gluon_swap_pair as gp

    for t, x, w, ids, ws in v41_cases(args.tokens):
        ref = None
        for cap in [int(v) for v in args.caps.split(",")]:
            gp.PAIR_DOWN_MAXNREG = cap
            if args.eager:
                for _ in range(args.eager):
                    sw.swap_mxfp4(x, w, ids, *ws, 10.0, paired=True)
                torch.cuda.synchronize()
                print(f"T={t} cap {cap}: {args.eager} calls (up, down launches each)", flush=True)
                continue
            out = sw.swap_mxfp4(x, w, ids, *ws, 10.0, paired=True)
            ref = out if ref is None else ref
            same = torch.equal(out, ref)
            print(f"== T={t} down cap {cap}: output bit-equal to the first cap's: {same}", flush=True)
            _profile_kernels(lambda: sw.swap_mxfp4(x, w, ids, *ws, 10.0, paired=True), f"T={t} cap={cap}")
    for k in _compiled_variants(gp._swap_pair_kernel):
        md = getattr(k, "metadata", None)
        regs, spills = getattr(k, "n_regs", None), getattr(k, "n_spills", None)
        shared = getattr(md, "shared", None)
        maxnreg = getattr(md, "maxnreg", None)
        occ = None
        if regs and shared is not None:
            by_regs = 65536 // (regs * 256)
            by_smem = (228 * 1024) // (shared + 1024)
            occ = min(by_regs, by_smem, 8)
        print(f"compiled _swap_pair_kernel: maxnreg {maxnreg} registers {regs} spills {spills} shared {shared}"
              f" -> programs an SM by registers/shared: {occ}")


if __name__ == "__main__":
    main()
