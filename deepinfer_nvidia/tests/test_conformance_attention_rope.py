"""``attention.sparse_sink_rope`` (``triton_attention.sparse_sink_rope``: q's RoPE at load, the output's inverse RoPE
in the split merge, or a rope launch after a one-split attention) switched on, on the GPU (skipped without one):

- the shared harness on the op's generated cases;
- V4.1's widths (64 heads of 512, a 64-channel rope, a 128-slot window and 0-512 selected entries) at 1, 2, 4, 64
  and 200 query rows, bf16 and fp32, against the CPU reference, outputs poisoned with NaN first; and against the
  parts on the GPU (the fused launch rounds where the parts round: within one bf16 rounding);
- inside a CUDA graph: a replay on new inputs equals an eager call.
"""
from __future__ import annotations

import pytest
import torch

from deepinfer_nvidia.tests.device_helpers import poison_allocator

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")


@pytest.fixture
def ta(monkeypatch):
    from deepinfer_nvidia.kernels import triton_attention

    monkeypatch.setattr(triton_attention, "ATTN_ROPE_FUSED", True)
    return triton_attention


def _case(t: int, na: int, nb: int, dtype, seed: int):
    from deepinfer_core.kernels.ops.rope import yarn_inv_freq

    g = torch.Generator().manual_seed(seed)
    h, d, sa, sb = 64, 512, 1024, 2048
    q = torch.randn(t, h, d, generator=g).to(dtype)
    kv_a = torch.randn(sa, d, generator=g).to(dtype)
    kv_b = torch.randn(sb, d, generator=g).to(dtype) if nb else None
    idx_a = torch.randint(0, sa, (t, na), generator=g)
    idx_a[:, : na // 3] = -1
    idx_b = torch.randint(-1, sb, (t, nb), generator=g) if nb else None
    sinks = torch.randn(h, generator=g)
    pos = torch.randint(0, 2 ** 31 - 1, (t,), generator=g)
    return [q, kv_a, idx_a, kv_b, idx_b, sinks, d ** -0.5, pos, yarn_inv_freq(64, 160000.0, 16.0, 65536)]


def _cuda(args):
    return [a.cuda() if isinstance(a, torch.Tensor) else a for a in args]


def test_harness(nvidia_reg, ta):
    from deepinfer_core.testing.conformance import check_impl

    assert check_impl("attention.sparse_sink_rope", "triton", "cuda", seeds=(0, 1, 2), registry=nvidia_reg) > 0


@pytest.mark.parametrize("t,na,nb", [(1, 128, 512), (2, 128, 512), (1, 128, 0), (4, 128, 512), (64, 128, 0),
                                     (200, 128, 64)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_model_width(ta, t, na, nb, dtype):
    from deepinfer_core.kernels.ops.attention import sparse_sink_rope as reference

    args = _case(t, na, nb, dtype, t + na + nb)
    ref = reference(*args)
    dev = _cuda(args)
    poison_allocator()
    out = ta.sparse_sink_rope(*dev)
    assert not torch.isnan(out).any(), "an element was never written"
    tol = 3e-2 if dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(out.float().cpu(), ref.float(), atol=tol, rtol=tol)
    ta.ATTN_ROPE_FUSED = False  # the parts on the GPU (monkeypatch restores the switch)
    parts = ta.sparse_sink_rope(*dev)
    one_rounding = 1e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(out, parts, atol=one_rounding, rtol=one_rounding)


def test_graph_replay_matches_eager(ta):
    static = _cuda(_case(1, 128, 512, torch.bfloat16, 3))
    run = lambda: ta.sparse_sink_rope(*static)  # noqa: E731
    run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    fresh = _cuda(_case(1, 128, 512, torch.bfloat16, 4))
    for dst, src in zip(static, fresh):
        if isinstance(dst, torch.Tensor):
            dst.copy_(src)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, run())
