"""``attention.sparse_sink``'s Triton launch (``deepinfer_nvidia/kernels/triton_attention.py``) in Triton's CPU
interpreter against the reference, at the launch shapes batch 1-2 take since the twenty-fourth pass
(``SMALL_BATCH_SPLIT``: 16 heads a program, 16-slot chunks, one chunk a split) and with that launch off (64 heads,
32-slot chunks, two chunks a split at least): slot lists whose last split is empty, rows of the window not yet
filled (-1), a row with no valid slot at all (its output must be exactly 0), and a launch without the second cache.
fp32 operands: Triton 3.9's interpreter returns garbage for bf16 x bf16 ``tl.dot`` (the bf16 launches run on the
GPU: ``deepinfer_nvidia/tests/test_conformance.py::test_attention_model_width``). ``supports`` asks for CUDA
tensors, so the script lets CPU tensors through to the kernel."""
from __future__ import annotations

_INTERPRETED = r"""
import torch
from deepinfer_core.kernels.ops.attention import sparse_attention_sink
from deepinfer_nvidia.kernels import triton_attention as ta

ta.supports = lambda *a: True  # CPU tensors into the interpreted kernel
g = torch.Generator().manual_seed(3)
h, d, sa, sb = 64, 64, 200, 300
cases, launches = 0, []
for small in (True, False):
    ta.SMALL_BATCH_SPLIT = small
    for t, na, nb, empty in ((1, 40, 70, False), (2, 40, 70, True), (1, 24, 0, False)):
        q = torch.randn(t, h, d, generator=g)
        kv_a = torch.randn(sa, d, generator=g)
        kv_b = torch.randn(sb, d, generator=g) if nb else None
        idx_a = torch.randint(0, sa, (t, na), generator=g)
        idx_a[:, : na // 3] = -1
        idx_b = torch.randint(-1, sb, (t, nb), generator=g) if nb else None
        if empty:
            idx_a[0] = -1
            idx_b[0] = -1
        sinks = torch.randn(h, generator=g)
        ref = sparse_attention_sink(q, kv_a, idx_a, kv_b, idx_b, sinks, d ** -0.5)
        seen = []
        kernel = ta._attn_kernel
        class Spy:
            def __getitem__(self, grid):
                seen.append(grid)
                return kernel[grid]
        ta._attn_kernel = Spy()
        try:
            out = ta.sparse_sink(q, kv_a, idx_a, kv_b, idx_b, sinks, d ** -0.5)
        finally:
            ta._attn_kernel = kernel
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        if empty:
            assert float(out[0].abs().max()) == 0.0
        launches.append((small, t, na + nb, seen[0]))
        cases += 1
# the grids: (tokens, head blocks, splits); fp32 keeps 16 heads a program in the old launch too, and its 64-slot
# chunks (d 64) leave the 110 slots unsplit
want = {(True, 1, 110): (1, 4, 8), (True, 2, 110): (2, 4, 8), (True, 1, 24): (1, 4, 2),
        (False, 1, 110): (1, 4, 1), (False, 2, 110): (2, 4, 1), (False, 1, 24): (1, 4, 1)}
for small, t, total, grid in launches:
    assert tuple(grid) == want[(small, t, total)], (small, t, total, grid)
print("INTERPRETED", cases)
"""


def test_attention_in_the_interpreter(run_interpreted):
    run_interpreted(_INTERPRETED, "INTERPRETED 6")
