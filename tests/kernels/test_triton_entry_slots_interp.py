"""The entry-slot map kernel (``deepinfer_nvidia/kernels/triton_entry_slots.py``) in Triton's CPU interpreter against
the ``index.entry_slots`` reference, exactly. ``entry_slots`` hands CPU tensors to the reference, so the script
calls the launcher ``_launch`` directly.

Covered: 1-33 rows; N from 1 to 2048 visible entries with -1 holes; k from 1 to 600 selections (two programs a
row past 512) with -1 padding; slots past 2^32 (int64 kept whole); a selection that is a column slice of a wider
tensor (strided rows) and a visible map that is one too. A position at or past N (outside the reference's
contract) maps to -1 instead of reading past the row."""
from __future__ import annotations

_INTERPRETED = r"""
import torch
from deepinfer_core.kernels.ops.indexer import entry_slots
from deepinfer_nvidia.kernels import triton_entry_slots as te

g = torch.Generator().manual_seed(0)
n_checked = 0
for t, n, k in ((1, 1, 1), (1, 64, 16), (5, 700, 512), (3, 2048, 600), (33, 40, 64)):
    for strided in (False, True):
        visible = torch.randint(0, 1 << 40, (t, n + 3), generator=g)
        visible[torch.rand(t, n + 3, generator=g) < 0.2] = -1
        sel = torch.randint(0, n, (t, k + 5), generator=g)
        sel[torch.rand(t, k + 5, generator=g) < 0.3] = -1
        visible, sel = (visible[:, 3:], sel[:, 5:]) if strided else (visible[:, 3:].contiguous(), sel[:, 5:].contiguous())
        out = te._launch(visible, sel)
        ref = entry_slots(visible, sel)
        assert out.dtype == torch.int64 and out.is_contiguous() and torch.equal(out, ref), (t, n, k, strided)
        assert (out > (1 << 32)).any() or n < 8
        n_checked += 1
sel = torch.tensor([[0, 3, 4, 99, -1]])
out = te._launch(torch.tensor([[7, 8, 9, 10]]), sel)
assert out.tolist() == [[7, 10, -1, -1, -1]], out
n_checked += 1
print("INTERPRETED", n_checked)
"""


def test_entry_slots_kernel_matches_the_reference_in_the_interpreter(run_interpreted):
    proc = run_interpreted(_INTERPRETED, "INTERPRETED")
    assert int(proc.stdout.split("INTERPRETED")[1].split()[0]) == 11
