"""``index.topk`` (Triton bisection select, ``triton_topk.py``) against the reference on the GPU (skipped without
one): the kept set equals the stable sort's at V4.1 sizes (k 512 over 1k-32k compressed entries, decode and prefill
rows), with exact ties, rows with fewer valid entries than k, streamed rows (N > one register block), pre-poisoned
outputs, no host synchronisation, capture in a CUDA graph, and row invariance."""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")


@pytest.fixture(scope="module")
def fn():
    from deepinfer_core.kernels.registry import get_registry
    from deepinfer_core.kernels.resolve import ensure_platform_kernels
    from deepinfer_nvidia.platform import NvidiaPlatform

    r = get_registry()
    ensure_platform_kernels(r, NvidiaPlatform())
    return r.impl("index.topk", "triton")


@pytest.fixture(params=[(1, True), (2, True), (3, True), (1, False), (4, False)],
                ids=["bisect", "probes2", "probes3", "bisect64", "probes4_64"])
def bits(request):
    """``triton_topk.RADIX_BITS`` and ``KEY32`` for the test: the bisection on int32 keys (the default), 2^2 and 2^3
    probes a pass, the bisection on int64 keys with a mask, and 16 probes a pass on int64 keys."""
    from deepinfer_nvidia.kernels import triton_topk as tt

    before = tt.RADIX_BITS, tt.KEY32
    tt.RADIX_BITS, tt.KEY32 = request.param
    yield request.param[0]
    tt.RADIX_BITS, tt.KEY32 = before


def poison() -> None:
    torch.cuda.synchronize()
    blobs = [torch.full((64 << 20,), float("nan"), device="cuda") for _ in range(2)]
    del blobs
    torch.cuda.synchronize()


def _scores(t: int, n: int, seed: int, ties: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(t, n, generator=g)
    if ties:
        s = (s * 2).round()
    # causal visibility: row i sees a growing prefix (some rows fewer than k entries)
    vis = torch.randint(1, n + 1, (t,), generator=g)
    s[torch.arange(n)[None, :] >= vis[:, None]] = float("-inf")
    return s.cuda()


def _check(got: torch.Tensor, s: torch.Tensor, k: int) -> None:
    from deepinfer_core.kernels.ops.indexer import topk_positions

    want = topk_positions(s.cpu(), k)
    got = got.cpu()
    assert got.shape == want.shape and got.dtype == torch.long
    assert torch.equal(got.sort(dim=-1).values, want.sort(dim=-1).values), "top-k sets differ"


@pytest.mark.parametrize("t,n,k", [(1, 1024, 512), (64, 1024, 512), (8, 4096, 512), (4, 32768, 512),
                                   (2048, 2048, 512), (3, 100, 512), (16, 9000, 2048)])
@pytest.mark.parametrize("ties", [False, True])
def test_topk_sets(fn, bits, t, n, k, ties):
    s = _scores(t, n, t * 7 + n, ties)
    poison()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = fn(s, k)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    _check(got, s, k)


def test_topk_graph_and_row_invariance(fn, bits):
    s = _scores(32, 4096, 3, True)
    static = s.clone()
    out = fn(static, 512)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(static, 512)
    fresh = _scores(32, 4096, 4, False)
    static.copy_(fresh)
    graph.replay()
    torch.cuda.synchronize()
    _check(out, fresh, 512)
    for i in (0, 17, 31):
        assert torch.equal(fn(fresh[i:i + 1].clone(), 512)[0], out[i]), f"row {i} depends on the batch"


@pytest.mark.parametrize("t,n,bs,kb", [(1, 1024, 8, 2048), (64, 4096, 8, 2048), (4, 32768, 8, 2048),
                                       (16, 131072, 8, 2048), (3, 1000, 8, 16)])
def test_candidate_blocks_sets(bits, monkeypatch, t, n, bs, kb):
    """``index.candidate_blocks`` (block maxima + the select) at V4.1's block of 8 and 2048 blocks, with
    ``CANDIDATES_KERNEL`` on: the set equals the reference's, no host synchronisation, and each row alone gives
    its row of the batch."""
    from deepinfer_core.kernels.ops.candidates import candidate_blocks
    from deepinfer_nvidia.kernels import triton_topk as tt
    from deepinfer_nvidia.kernels.triton_topk import candidate_blocks_triton

    monkeypatch.setattr(tt, "CANDIDATES_KERNEL", True)

    s = _scores(t, n, t + n, ties=True)
    vis = torch.randint(0, n + 1, (t,), generator=torch.Generator().manual_seed(n)).cuda()
    s[torch.arange(n, device="cuda")[None, :] >= vis[:, None]] = float("-inf")
    poison()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = candidate_blocks_triton(s, vis, bs, kb)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    want = candidate_blocks(s.cpu(), vis.cpu(), bs, kb)
    assert got.shape == want.shape and got.dtype == torch.long
    assert torch.equal(got.cpu().sort(dim=-1).values, want.sort(dim=-1).values), "candidate block sets differ"
    for i in {0, t - 1}:
        assert torch.equal(candidate_blocks_triton(s[i:i + 1].clone(), vis[i:i + 1].clone(), bs, kb)[0], got[i])


@pytest.mark.parametrize("t,n,bs,k", [(1, 4096, 8, 2048), (4, 20000, 8, 2048), (3, 61, 4, 5), (33, 1000, 16, 200)])
def test_candidate_mask(nvidia_reg, t, n, bs, k):
    """``index.candidate_mask`` (``triton_candidate_mask``: a -inf fill and one copy of the listed blocks): the
    harness's cases, then V4.1's block of 8 and 2048 listed blocks over 4096 and 20000 scores, with ids of -1, past
    the last block, repeated and in any order: the reference's values bit for bit, no host synchronisation, each row
    alone gives its row of the batch, and a graph replay on fresh inputs gives the eager result."""
    from deepinfer_core.kernels.ops.candidates import candidate_mask
    from deepinfer_core.testing.conformance import check_impl
    from deepinfer_nvidia.kernels.triton_candidate_mask import candidate_mask_triton

    assert check_impl("index.candidate_mask", "triton", "cuda", registry=nvidia_reg) >= 1
    g = torch.Generator().manual_seed(t + n)
    s = torch.randn(t, n, generator=g).cuda()
    nb = -(-n // bs)
    blocks = torch.randint(-1, nb + 3, (t, k), generator=g).cuda()
    poison()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = candidate_mask_triton(s, blocks, bs)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(got.cpu(), candidate_mask(s.cpu(), blocks.cpu(), bs))
    for i in {0, t - 1}:
        assert torch.equal(candidate_mask_triton(s[i:i + 1].clone(), blocks[i:i + 1].clone(), bs)[0], got[i])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = candidate_mask_triton(s, blocks, bs)
    for seed in range(2):
        s.copy_(torch.randn(t, n, generator=torch.Generator().manual_seed(seed)))
        blocks.copy_(torch.randint(-1, nb + 3, (t, k), generator=torch.Generator().manual_seed(seed + 7)))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static, candidate_mask_triton(s, blocks, bs)), seed
