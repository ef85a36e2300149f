"""``moe.route_topk`` / ``moe.route_hash`` (``triton_route.py``), ``compress.softmax_pool`` and
``compress.ring_pair_pool`` (``triton_compress.py``) against their references on the GPU
(skipped without one).

    python3 -m pytest -q deepinfer_nvidia/tests/test_conformance_route_compress.py

Sizes of DeepSeek-V4 / V4.1-Flash: T in 1..8192 tokens over E = 256 / 384 experts (and E = 257, not a power of
two), k in {1, 2, 6, 8}; compressor windows S in {2, 4, 8, 128}, d in {128, 512}, N up to 4096, fp32 and bf16
kv with NaN garbage in absent slots. Every launch runs on a NaN-poisoned allocator and under
``torch.cuda.set_sync_debug_mode("error")``; a token alone must equal the same token inside a batch, bit for
bit; a CUDA graph replay with new inputs must equal the eager launch.

Routing ids are checked exactly against the reference with ``torch.topk`` replaced by a stable descending sort
(exact ties to the lower id, as the kernel) and a correctly rounded sqrt (torch's fp32 CPU sqrt is not); rows
without a near-tie at the k-th place are also checked against ``route_topk`` itself with its comparator.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _nosync(fn, *args):
    """``fn(*args)`` with any host synchronisation raising (these run inside captured decode steps)."""
    torch.cuda.set_sync_debug_mode("error")
    try:
        return fn(*args)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def _poisoned(fn, *args):
    from deepinfer_nvidia.tests.test_conformance import poison

    poison()
    out = _nosync(fn, *args)
    torch.cuda.synchronize()
    return out


def _scores(x: torch.Tensor) -> torch.Tensor:
    """The reference's sqrtsoftplus (softplus in fp64, rounded to fp32) with a correctly rounded sqrt."""
    return F.softplus(x.double()).float().double().sqrt().float()


def _stable_route(x, b, k, scaling):
    """``route_topk`` with exact ties going to the lower id; ids in descending biased-score order."""
    s = _scores(x)
    keys = s + b.float()
    order = torch.sort(keys, dim=-1, descending=True, stable=True)
    ids = order.indices[:, :k]
    w = s.gather(1, ids)
    return w / (w.sum(-1, keepdim=True) + 1e-20) * scaling, ids, order.values


def _route_inputs(t, e, seed, dtype=torch.float32):
    g = _gen(seed)
    return (torch.randn(t, e, generator=g) * 2).to(dtype), torch.randn(e, generator=g) * 0.1


@pytest.mark.parametrize("t", [1, 5, 64, 1000, 8192])
@pytest.mark.parametrize("e", [256, 384, 257])
@pytest.mark.parametrize("k", [1, 2, 6, 8])
def test_route_topk(t, e, k):
    from deepinfer_core.kernels.ops.moe import _compare_route, route_topk
    from deepinfer_nvidia.kernels import triton_route as tr

    x, b = _route_inputs(t, e, seed=t * 7 + e + k)
    w, ids = (o.cpu() for o in _poisoned(tr.route_topk, x.cuda(), b.cuda(), k, 2.5))
    assert w.dtype == torch.float32 and ids.dtype == torch.long and w.shape == ids.shape == (t, k)
    ws, iw, keys = _stable_route(x, b, k, 2.5)
    assert torch.equal(ids, iw)
    torch.testing.assert_close(w, ws, atol=1e-6, rtol=1e-6)
    if k < e:  # against the reference itself where its unspecified tie order cannot matter
        clear = (keys[:, k - 1] - keys[:, k]) > 1e-6 * keys[:, k - 1].abs().clamp(min=1.0)
        rows = clear.nonzero().flatten()
        _compare_route((w[rows], ids[rows]), route_topk(x[rows], b, k, 2.5), torch.float32)


def test_route_topk_bf16_logits_and_ties():
    from deepinfer_nvidia.kernels import triton_route as tr

    x, b = _route_inputs(300, 384, seed=5, dtype=torch.bfloat16)  # bf16 logits: many exact ties
    x[7] = 0.5
    b[::3] = 0.0
    w, ids = (o.cpu() for o in _poisoned(tr.route_topk, x.cuda(), b.cuda(), 6, 1.0))
    ws, iw, _ = _stable_route(x.float(), b, 6, 1.0)
    assert torch.equal(ids, iw)
    torch.testing.assert_close(w, ws, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("t", [1, 64, 8192])
@pytest.mark.parametrize("e,k", [(256, 6), (384, 6), (257, 8), (384, 1)])
@pytest.mark.parametrize("ids_dtype", [torch.int64, torch.int32])
def test_route_hash(t, e, k, ids_dtype):
    from deepinfer_core.kernels.ops.moe import route_hash
    from deepinfer_nvidia.kernels import triton_route as tr

    x, _ = _route_inputs(t, e, seed=t + e + k)
    ids = torch.stack([torch.randperm(e, generator=_gen(i))[:k] for i in range(t)])
    w, i = (o.cpu() for o in _poisoned(tr.route_hash, x.cuda(), ids.to(ids_dtype).cuda(), 1.5))
    wr, ir = route_hash(x, ids, 1.5)
    assert torch.equal(i, ir) and i.dtype == torch.long
    torch.testing.assert_close(w, wr, atol=1e-5, rtol=1e-5)


def _pool_inputs(n, s, d, dtype, seed):
    """Scores with absent slots (the first slots of some windows, ~30% at random) holding NaN / inf kv;
    every (entry, channel) keeps one present slot."""
    g = _gen(seed)
    kv = torch.randn(n, s, d, generator=g).to(dtype)
    sc = torch.randn(n, s, d, generator=g) * 2
    absent = torch.rand(n, s, d, generator=g) < 0.3
    absent[: n // 3, : max(1, s // 4)] = True  # windows at the start of a sequence
    absent[:, s - 1] = False
    sc[absent] = float("-inf")
    kv[absent] = torch.tensor([float("nan"), float("inf")]).to(dtype)[torch.randint(0, 2, (int(absent.sum()),),
                                                                                    generator=g)]
    return kv, sc


_POOL_CASES = [(1, 2, 512), (4096, 2, 512), (2048, 4, 512), (2048, 8, 512), (7, 8, 128), (33, 4, 128),
               (300, 128, 512), (64, 128, 128), (1, 128, 512)]


@pytest.mark.parametrize("n,s,d", _POOL_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_softmax_pool(n, s, d, dtype):
    from deepinfer_core.kernels.ops.compress import softmax_pool
    from deepinfer_nvidia.kernels import triton_compress as tc
    from deepinfer_nvidia.tests.test_conformance import close

    kv, sc = _pool_inputs(n, s, d, dtype, seed=n + s + d)
    out = _poisoned(tc.softmax_pool, kv.cuda(), sc.cuda())
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    close(out, softmax_pool(kv, sc), tol, tol)


@pytest.mark.parametrize("s", [2, 8, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_softmax_pool_one_present_slot_is_exact(s, dtype):
    """All slots absent but one, NaN garbage elsewhere: the output is that slot's kv, bit for bit."""
    from deepinfer_nvidia.kernels import triton_compress as tc

    g = _gen(s)
    n, d = 40, 512
    kv = torch.full((n, s, d), float("nan")).to(dtype)
    sc = torch.full((n, s, d), float("-inf"))
    at = torch.randint(0, s, (n, 1, d), generator=g)
    vals = torch.randn(n, 1, d, generator=g).to(dtype)
    kv.scatter_(1, at, vals)
    sc.scatter_(1, at, torch.randn(n, 1, d, generator=g) * 5)
    out = _poisoned(tc.softmax_pool, kv.cuda(), sc.cuda()).cpu()
    assert out.dtype == dtype and torch.equal(out, vals[:, 0])


def test_rows_are_batch_invariant():
    """Token / entry i launched alone equals token / entry i inside a batch, bit for bit."""
    from deepinfer_nvidia.kernels import triton_compress as tc, triton_route as tr

    x, b = (a.cuda() for a in _route_inputs(300, 384, seed=1))
    ids = torch.stack([torch.randperm(384, generator=_gen(i))[:6] for i in range(300)]).cuda()
    kv, sc = (a.cuda() for a in _pool_inputs(300, 8, 512, torch.bfloat16, seed=2))
    batch = (tr.route_topk(x, b, 6, 2.5), tr.route_hash(x, ids, 2.5), (tc.softmax_pool(kv, sc),))
    for i in (0, 1, 150, 299):
        alone = (tr.route_topk(x[i:i + 1], b, 6, 2.5), tr.route_hash(x[i:i + 1], ids[i:i + 1], 2.5),
                 (tc.softmax_pool(kv[i:i + 1], sc[i:i + 1]),))
        for got, want in zip(alone, batch):
            for a, c in zip(got, want):
                assert torch.equal(a[0], c[i]), i


def test_captured_and_replayed_with_new_inputs():
    """The three launches in one CUDA graph, replayed with new logits / ids / windows: equal to eager."""
    from deepinfer_nvidia.kernels import triton_compress as tc, triton_route as tr

    def inputs(seed):
        x, b = _route_inputs(64, 384, seed)
        ids = torch.randint(0, 384, (64, 6), generator=_gen(seed))
        kv, sc = _pool_inputs(16, 4, 512, torch.bfloat16, seed)
        return [a.cuda() for a in (x, b, ids, kv, sc)]

    def step(x, b, ids, kv, sc):
        return tr.route_topk(x, b, 6, 2.5) + tr.route_hash(x, ids, 2.5) + (tc.softmax_pool(kv, sc),)

    static = inputs(0)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(*static)  # compile and warm up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step(*static)
    for seed in (1, 2):
        new = inputs(seed)
        for dst, src in zip(static, new):
            dst.copy_(src)
        graph.replay()
        for got, want in zip(out, step(*new)):
            assert torch.equal(got, want), seed


@pytest.mark.parametrize("t", [1, 8, 64])
def test_ring_pair_pool(t):
    """``compress.ring_pair_pool`` at V4.1's width (d 512, ring of 8): the pool is ``compress.softmax_pool``'s kernel's
    bits on the stacked pair, the ring is written as the reference writes it, no host sync, and a captured launch
    replayed with new inputs equals the eager one."""
    from deepinfer_core.kernels.ops.compress import _compare_ring_pair, ring_pair_pool as ref
    from deepinfer_nvidia.kernels import triton_compress as tc

    g = _gen(500 + t)
    both = torch.randn(t, 1024, generator=g).cuda()
    ring = torch.randn(t + 5, 8, 1024, generator=g).cuda()
    slot = torch.randperm(t + 5, generator=g)[:t].cuda()
    pos = torch.randint(0, 5000, (t,), generator=g).cuda()
    pair = torch.stack([ring[slot, (pos - 1) % 8], both], dim=1)
    pooled = tc.softmax_pool(pair[..., :512], pair[..., 512:])
    ring_ref = ring.clone()
    got = _nosync(tc.ring_pair_pool, both, ring, slot, pos)
    _compare_ring_pair(got, ref(both, ring_ref, slot, pos), torch.float32)
    assert torch.equal(got[0], pooled) and torch.equal(ring, ring_ref)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = tc.ring_pair_pool(both, ring, slot, pos)
    both.copy_(torch.randn(t, 1024, generator=g).cuda())
    pos.add_(1)
    ring_before = ring.clone()
    graph.replay()
    torch.cuda.synchronize()
    want = tc.ring_pair_pool(both, ring_before, slot, pos)
    assert torch.equal(out[0], want[0]) and torch.equal(out[1], want[1]) and torch.equal(ring, ring_before)


@pytest.mark.parametrize("t", [1, 2, 64])
@pytest.mark.parametrize("ratio", [1, 2])
def test_entry_write(t, ratio):
    """``compress.entry_write``'s kernel at V4.1's width (d 512, a 64-wide RoPE tail, fp32 u, bf16 latent and
    cache): within the reference's tolerance, the entries bit-equal to the platform's parts (``norm.rms``'s kernel
    and ``rope.interleaved``'s, when the two latents agree), unkept rows untouched, no host sync, and a captured
    launch replayed with new inputs equal to the eager one."""
    from deepinfer_core.kernels.ops.compress import _compare_entry_write, entry_write as ref
    from deepinfer_core.kernels.ops.rope import default_inv_freq
    from deepinfer_nvidia.kernels import triton_compress_entry as te

    g = _gen(700 + t + ratio)
    u = (3 * torch.randn(t, 512, generator=g)).cuda()
    w = (1 + 0.1 * torch.randn(512, generator=g)).cuda()
    pos = torch.randint(0, 70000, (t,), generator=g).cuda()
    inv = default_inv_freq(64, 10000.0).cuda()
    cache = torch.randn(t + 9, 512, generator=g).to(torch.bfloat16).cuda()
    slots = torch.randperm(t + 9, generator=g)[:t].cuda()
    keep = (torch.rand(t, generator=g) > 0.25).cuda() if t > 1 else None
    cache_ref, cache_parts = cache.clone(), cache.clone()
    kw = {"ratio": ratio, "dtype": torch.bfloat16, "force_kernel": True}
    got = _poisoned(lambda *a: te.entry_write(*a, **kw), u, w, 1e-6, pos, inv, cache, slots, keep)
    want = ref(u.cpu(), w.cpu(), 1e-6, pos.cpu(), inv.cpu(), cache_ref.cpu(), slots.cpu(),
               None if keep is None else keep.cpu(), ratio=ratio, dtype=torch.bfloat16)
    _compare_entry_write(got, want, torch.float32)
    parts = te._parts()(u, w, 1e-6, pos, inv, cache_parts, slots, keep, ratio=ratio, dtype=torch.bfloat16)
    same = (got[0] == parts[0]).all(dim=1)  # rows whose latents agree bit for bit (the two reduce differently)
    assert same.float().mean() > 0.5, "the latent differs from norm.rms's kernel in most rows"
    assert torch.equal(cache[slots[same]], cache_parts[slots[same]]) and torch.equal(got[1], parts[1])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = te.entry_write(u, w, 1e-6, pos, inv, cache, slots, keep, **kw)
    u.copy_((3 * torch.randn(t, 512, generator=g)).cuda())
    pos.add_(3)
    cache_before = cache.clone()
    graph.replay()
    torch.cuda.synchronize()
    again = te.entry_write(u, w, 1e-6, pos, inv, cache_before, slots, keep, **kw)
    assert torch.equal(out[0], again[0]) and torch.equal(out[1], again[1]) and torch.equal(cache, cache_before)


def test_entry_write_in_the_engine(tmp_path, monkeypatch):
    """A tiny V4.1 checkpoint (ratio-1 and ratio-2 kv sources, MXFP4 experts) through the engine, graphed, with
    ``compress.entry_write`` as the platform's parts and as the fused kernel: the same greedy tokens, logprobs
    within a bf16 rounding's reach (the kernel's latent may differ from ``norm.rms``'s kernel by one rounding)."""
    from deepinfer_core import LLM, SamplingParams
    from deepinfer_models.deepseek_v41.checkpoint_writer import tiny_v41_config, write_tiny_v41_checkpoint
    from deepinfer_nvidia.kernels import triton_compress_entry as te
    from deepinfer_nvidia.platform import NvidiaPlatform

    path = write_tiny_v41_checkpoint(tmp_path / "v41", tiny_v41_config("mixed"), quant="fp4", seed=3)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, 1000, (n,), generator=g).tolist() for n in (5, 40, 90, 13)]
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, logprobs=1)
    runs = []
    for fused in (False, True):
        monkeypatch.setattr(te, "FUSED", fused)
        llm = LLM(str(path), dtype="bfloat16", max_model_len=512, max_num_seqs=4, kv_cache_memory_bytes=1 << 30,
                  platform=NvidiaPlatform(), graph_capture_sizes=[1, 2, 4])
        outs = llm.generate(prompts, params, use_tqdm=False)
        runs.append([(list(o.outputs[0].token_ids), [max(d.values(), key=lambda v: v.logprob).logprob
                                                     for d in o.outputs[0].logprobs]) for o in outs])
        del llm
        torch.cuda.synchronize()
    (parts, fused) = runs
    for (t0, l0), (t1, l1) in zip(parts, fused):
        assert t0 == t1, "greedy tokens differ between the parts and the fused entry kernel"
        assert max(abs(a - b) for a, b in zip(l0, l1)) < 0.05
