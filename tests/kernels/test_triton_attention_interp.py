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


_ROPE = r"""
import torch
from deepinfer_core.kernels.ops.attention import sparse_sink_rope as reference
from deepinfer_core.kernels.ops.rope import default_inv_freq, yarn_inv_freq
from deepinfer_nvidia.kernels import triton_attention as ta

ta.supports = lambda *a: True  # CPU tensors into the interpreted kernel
g = torch.Generator().manual_seed(4)
h, d, sa, sb = 16, 64, 100, 120
cases = 0
for small, t, na, nb in ((True, 1, 40, 70), (True, 2, 24, 0), (False, 3, 40, 70)):
    ta.SMALL_BATCH_SPLIT = small  # split + merge (the output's rotation in the merge) / one split (a rope launch)
    for f in (default_inv_freq(16, 10000.0), yarn_inv_freq(32, 160000.0, 16.0, 65536)):
        q = torch.randn(t, h, d, generator=g)
        kv_a, kv_b = torch.randn(sa, d, generator=g), torch.randn(sb, d, generator=g) if nb else None
        idx_a = torch.randint(-1, sa, (t, na), generator=g)
        idx_b = torch.randint(-1, sb, (t, nb), generator=g) if nb else None
        sinks = torch.randn(h, generator=g)
        pos = torch.tensor([5, 10 ** 6, 2 ** 31 - 1])[:t]
        out = ta.sparse_sink_rope(q, kv_a, idx_a, kv_b, idx_b, sinks, d ** -0.5, pos, f, force_kernel=True)
        torch.testing.assert_close(out, reference(q, kv_a, idx_a, kv_b, idx_b, sinks, d ** -0.5, pos, f),
                                   atol=1e-5, rtol=1e-5)
        cases += 1
print("INTERPRETED", cases)
"""


def test_attention_with_rope_in_the_interpreter(run_interpreted):
    """``attention.sparse_sink_rope``'s fused launch: q's RoPE at load, the output's inverse RoPE in the split merge
    (batch 1-2) or in a rope launch after a one-split attention; the default and the YaRN frequencies, positions to
    2^31 - 1, fp32 (the interpreter's bf16 dot: above)."""
    run_interpreted(_ROPE, "INTERPRETED 6")


def test_attention_with_rope_off_runs_its_parts():
    """Switched off (the default) on CPU tensors, the parts hand off to the references: the reference's bits."""
    import pytest
    import torch

    pytest.importorskip("triton")
    from deepinfer_core.kernels.ops.attention import sparse_sink_rope as reference
    from deepinfer_core.kernels.ops.rope import default_inv_freq
    from deepinfer_nvidia.kernels import triton_attention as ta

    assert not ta.ATTN_ROPE_FUSED
    g = torch.Generator().manual_seed(0)
    q, kv, idx = torch.randn(2, 4, 32, generator=g), torch.randn(9, 32, generator=g), torch.tensor([[0, 3, -1], [8, 1, 2]])
    args = (q, kv, idx, None, None, torch.randn(4, generator=g), 0.2, torch.tensor([3, 4]), default_inv_freq(16, 1e4))
    assert torch.equal(ta.sparse_sink_rope(*args), reference(*args))
