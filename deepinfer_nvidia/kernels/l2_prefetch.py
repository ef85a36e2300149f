"""Hopper's bulk L2 prefetch for the weight-streaming kernels (``gluon_fp8_gemv``, ``gluon_swap_pair``).

``cp.async.bulk.prefetch.L2.global [addr], n`` (SM90, PTX 8.0) asks the TMA unit to bring ``n`` bytes (a multiple
of 16, 16-byte aligned) into L2 and returns at once: no shared memory, no register, no completion to wait for.
The kernels' ``cp.async`` rings keep only STAGES - 1 tiles in flight a program, so at batch 1 each program
waits on DRAM latency every few tiles; asking L2 for tiles further ahead puts more bytes in flight without a
deeper ring (whose barriers and shared memory made it slower: docs/performance.md, twenty-sixth pass), and a
kernel under programmatic dependent launch can ask for its first weights before ``griddepcontrol.wait``, while the
previous kernel runs (weights are never written by a kernel).

``prefetch_asm(n)`` is the inline-PTX body for ``inline_asm_elementwise`` with operands (``=r`` dummy result,
``l`` address, ``r`` predicate): a thread whose predicate is 0 issues nothing. ``n = 0`` is the load/store
unit's ``prefetch.global.L2`` of the 128-byte line holding the address instead (no TMA request).

Measured (H100, thirty-fourth pass, ``prefetch_check``; outputs bit-equal): bulk requests of 64 bytes a thread made
one V4.1 layer's GEMVs at one row 88.6 -> 105.4 us and the swap experts at one token 65.8 -> 99.5 us; lines (the
default form when a knob is on) 88.6 -> 95.8 and 65.5 -> 70.5. Not bytes in flight: at one row the GEMVs are
bound by their launches (a kernel that only adds up the same bytes with the same grid is 13% faster;
docs/performance.md, thirty-fifth pass), so the knobs (``gluon_fp8_gemv.GEMV_L2_PREFETCH``, ``gluon_swap_pair.PAIR_L2_PREFETCH``)
are off by default (docs/performance.md, thirty-fourth pass).
"""
from __future__ import annotations

import os

# The kernels' form when their prefetch knob is on: lines (default) or 64/32-byte bulk requests
# (``DEEPINFER_NV_L2_PREFETCH_BULK=1``, for A/B runs).
LINE = os.environ.get("DEEPINFER_NV_L2_PREFETCH_BULK", "0") != "1"


def prefetch_asm(nbytes: int) -> str:
    """PTX: if $2 != 0, prefetch ``nbytes`` bytes at address $1 into L2 (0: the line holding $1); $0 = 0."""
    if nbytes == 0:
        return "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.b32 $0, 0; }"
    if nbytes < 0 or nbytes % 16:
        raise ValueError(f"bulk L2 prefetch sizes are positive multiples of 16 bytes, got {nbytes}")
    return ("{ .reg .pred p; setp.ne.b32 p, $2, 0; "
            f"@p cp.async.bulk.prefetch.L2.global [$1], {nbytes}; mov.b32 $0, 0; }}")
