"""The Engram window kernel (``deepinfer_nvidia/kernels/triton_engram_window.py``) in Triton's CPU interpreter against
the ``engram.window`` reference, exactly (window ids wherever valid, the valid mask everywhere). ``window`` hands
CPU tensors to the reference, so the script calls the launcher ``_launch`` directly.

Covered: decode steps (one token a slice, 1 and 5 slices, positions 0-3 where columns fall before position 0, and
long ones where they come from the history ring, wrapping at C), prefill chunks (several tokens a slice: the
columns inside the slice come from this step's rows, the ones before its start from the ring), N = 1-4 and 16,
a history with a row stride wider than C (a column slice), and reads where p - s < 0 that must stay inside the
ring (the floored modulo)."""
from __future__ import annotations

_INTERPRETED = r"""
import torch
from deepinfer_core.kernels.ops.engram import window_ids
from deepinfer_nvidia.kernels import triton_engram_window as tw

g = torch.Generator().manual_seed(0)
n_checked = 0
for lens, starts, n, cap in [([1], [0], 4, 16), ([1] * 5, [0, 1, 3, 40, 1000], 4, 16), ([6, 1, 3], [0, 17, 2], 3, 8),
                             ([4, 4], [2, 30], 16, 16), ([2, 1], [9, 0], 1, 16), ([7], [20], 2, 4)]:
    for wide in (False, True):
        slots = torch.randperm(9, generator=g)[: len(lens)]
        pos = torch.cat([torch.arange(st, st + ln) for st, ln in zip(starts, lens)])
        start = torch.cat([torch.full((ln,), st) for st, ln in zip(starts, lens)])
        slot = torch.cat([torch.full((ln,), int(sl)) for sl, ln in zip(slots, lens)])
        ids = torch.randint(0, 1000, (pos.shape[0],), generator=g)
        hist = torch.randint(0, 1000, (9, cap + 5), generator=g)
        history = hist[:, 5:] if wide else hist[:, 5:].contiguous()
        win, valid = tw._launch(ids, pos, start, slot, history, n)
        rw, rv = window_ids(ids, pos, start, slot, history, n)
        assert win.dtype == torch.int64 and valid.dtype == torch.bool
        assert torch.equal(valid, rv), (lens, starts, n)
        assert torch.equal(torch.where(rv, win, 0), torch.where(rv, rw, 0)), (lens, starts, n, win, rw)
        n_checked += 1
print("INTERPRETED", n_checked)
"""


def test_engram_window_kernel_matches_the_reference_in_the_interpreter(run_interpreted):
    proc = run_interpreted(_INTERPRETED, "INTERPRETED")
    assert int(proc.stdout.split("INTERPRETED")[1].split()[0]) == 12
