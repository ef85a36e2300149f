"""Each reference op against textbook math written independently, in float64."""
from __future__ import annotations

import math

import pytest
import torch

from deepinfer_core.kernels.ops import attention, compress, indexer, mhc, moe, norm, rope

D = torch.float64


def test_rms_norm_weighted_and_unweighted():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 24, generator=g, dtype=D)
    w = torch.randn(24, generator=g, dtype=D)
    for i in range(5):
        r = math.sqrt(sum(v * v for v in x[i].tolist()) / 24 + 1e-6)
        exp = torch.tensor([w[j].item() * x[i, j].item() / r for j in range(24)], dtype=D)
        torch.testing.assert_close(norm.rms_norm(x, w, 1e-6)[i], exp)
        torch.testing.assert_close(norm.rms_norm_unweighted(x, 1e-6)[i], x[i] / r)


def test_interleaved_tail_rope_and_inverse():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 2, 12, generator=g, dtype=D)
    pos = torch.tensor([0, 5, 1000])
    inv = rope.default_inv_freq(4, 10000.0).double()
    y = rope.apply_rope(x, pos, inv)
    for t in range(3):
        for h in range(2):
            assert torch.equal(y[t, h, :8], x[t, h, :8])  # nope part untouched
            for i in range(2):
                ang = pos[t].item() * (10000.0 ** (-2 * i / 4))
                a, b = x[t, h, 8 + 2 * i].item(), x[t, h, 9 + 2 * i].item()
                assert abs(y[t, h, 8 + 2 * i].item() - (a * math.cos(ang) - b * math.sin(ang))) < 1e-6
                assert abs(y[t, h, 9 + 2 * i].item() - (b * math.cos(ang) + a * math.sin(ang))) < 1e-6
    torch.testing.assert_close(rope.apply_rope(y, pos, inv, inverse=True), x)


def test_yarn_inv_freq_textbook():
    rd, base, factor, L0 = 64, 160000.0, 16.0, 65536
    got = rope.yarn_inv_freq(rd, base, factor, L0)
    cdim = lambda r: rd * math.log(L0 / (r * 2 * math.pi)) / (2 * math.log(base))
    low, high = max(math.floor(cdim(32)), 0), min(math.ceil(cdim(1)), rd - 1)
    for i in range(rd // 2):
        f = base ** (-2 * i / rd)
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)
        assert abs(got[i].item() - (f / factor * ramp + f * (1 - ramp))) < 1e-6 * max(f, 1e-3)


def test_sparse_attention_with_sinks_textbook():
    g = torch.Generator().manual_seed(2)
    T, H, Dh = 3, 2, 8
    q = torch.randn(T, H, Dh, generator=g, dtype=D)
    kv_a, kv_b = torch.randn(6, Dh, generator=g, dtype=D), torch.randn(4, Dh, generator=g, dtype=D)
    idx_a = torch.tensor([[0, 1, -1], [2, -1, -1], [3, 4, 5]])
    idx_b = torch.tensor([[-1, 0], [1, 2], [-1, -1]])
    sinks = torch.randn(H, generator=g, dtype=torch.float32)
    out = attention.sparse_attention_sink(q, kv_a, idx_a, kv_b, idx_b, sinks, 0.3)
    for t in range(T):
        keys = [kv_a[i] for i in idx_a[t].tolist() if i >= 0] + [kv_b[i] for i in idx_b[t].tolist() if i >= 0]
        for h in range(H):
            logits = [0.3 * float(q[t, h] @ k) for k in keys]
            den = sum(math.exp(l) for l in logits) + math.exp(sinks[h].item())
            exp = sum((math.exp(l) / den) * k for l, k in zip(logits, keys))
            torch.testing.assert_close(out[t, h], exp.to(D), atol=1e-6, rtol=1e-5)


def test_softmax_pool_textbook_and_absent_slots():
    g = torch.Generator().manual_seed(3)
    kv = torch.randn(2, 5, 3, generator=g, dtype=D)
    sc = torch.randn(2, 5, 3, generator=g, dtype=D)
    sc[0, :2] = float("-inf")
    kv[0, :2] = float("nan")  # garbage in absent slots must not leak
    out = compress.softmax_pool(kv, sc)
    for n in range(2):
        for c in range(3):
            s0 = 2 if n == 0 else 0
            ws = [math.exp(sc[n, s, c].item()) for s in range(s0, 5)]
            exp = sum(w * kv[n, s, c].item() for w, s in zip(ws, range(s0, 5))) / sum(ws)
            assert abs(out[n, c].item() - exp) < 1e-9


def test_indexer_scores_and_topk():
    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, 3, 4, generator=g, dtype=D)
    w = torch.randn(2, 3, generator=g, dtype=D)
    keys = torch.randn(5, 4, generator=g, dtype=D)
    cand = torch.tensor([[0, 1, 2, -1], [4, 3, -1, -1]])
    s = indexer.indexer_scores(q, w, keys, cand, 0.5)
    for t in range(2):
        for n in range(4):
            c = cand[t, n].item()
            if c < 0:
                assert s[t, n].item() == float("-inf")
                continue
            exp = sum(w[t, h].item() * max(0.0, float(q[t, h] @ keys[c])) * 0.5 for h in range(3))
            assert abs(s[t, n].item() - exp) < 1e-9
    pos = indexer.topk_positions(s, 3)
    assert set(pos[0].tolist()) == {0, 1, 2}
    assert set(pos[1].tolist()) == {0, 1, -1}
    ranked = sorted(range(3), key=lambda i: -s[0, i].item())[:2]
    assert set(indexer.topk_positions(s, 2)[0].tolist()) == set(ranked)


def test_mhc_mix_collapse_expand_textbook():
    g = torch.Generator().manual_seed(5)
    T, n, Dm = 2, 4, 6
    R = torch.randn(T, n, Dm, generator=g, dtype=D)
    fn = torch.randn((2 + n) * n, n * Dm, generator=g, dtype=D) * 0.2
    base = torch.randn((2 + n) * n, generator=g, dtype=D)
    scale = torch.rand(3, generator=g, dtype=D) + 0.5
    pre, post, comb = mhc.mhc_mix(R, fn, base, scale, 1e-6, 1e-6, 20)
    sig = lambda v: 1 / (1 + math.exp(-v))
    for t in range(T):
        v = R[t].reshape(-1)
        m = (fn.double() @ (v / math.sqrt(float((v * v).mean()) + 1e-6)))
        for i in range(n):
            assert abs(pre[t, i].item() - (sig(scale[0].item() * m[i].item() + base[i].item()) + 1e-6)) < 1e-6
            assert abs(post[t, i].item() - 2 * sig(scale[1].item() * m[n + i].item() + base[n + i].item())) < 1e-6
        C = [[scale[2].item() * m[2 * n + i * n + j].item() + base[2 * n + i * n + j].item() for j in range(n)] for i in range(n)]
        C = [[math.exp(c) / sum(math.exp(x) for x in row) + 1e-6 for c in row] for row in C]
        cs = [sum(C[i][j] for i in range(n)) for j in range(n)]
        C = [[C[i][j] / (cs[j] + 1e-6) for j in range(n)] for i in range(n)]
        for _ in range(19):
            C = [[c / (sum(row) + 1e-6) for c in row] for row in C]
            cs = [sum(C[i][j] for i in range(n)) for j in range(n)]
            C = [[C[i][j] / (cs[j] + 1e-6) for j in range(n)] for i in range(n)]
        torch.testing.assert_close(comb[t].double(), torch.tensor(C, dtype=D), atol=1e-6, rtol=1e-6)
    # doubly stochastic after Sinkhorn
    torch.testing.assert_close(comb.sum(-1), torch.ones(T, n, dtype=comb.dtype), atol=1e-4, rtol=0)
    x = mhc.mhc_collapse(R, pre)
    torch.testing.assert_close(x[1], sum(pre[1, k].double() * R[1, k] for k in range(n)))
    y = torch.randn(T, Dm, generator=g, dtype=D)
    R2 = mhc.mhc_expand(R, y, post, comb)
    for j in range(n):
        exp = post[0, j].double() * y[0] + sum(comb[0, i, j].double() * R[0, i] for i in range(n))
        torch.testing.assert_close(R2[0, j], exp)
    # the sublayer output as parts (the MoE's routed and shared outputs): their sum, taken in the accumulation dtype
    y2 = torch.randn(T, Dm, generator=g, dtype=D)
    torch.testing.assert_close(mhc.mhc_expand(R, (y, y2), post, comb), mhc.mhc_expand(R, y + y2, post, comb))


def test_mhc_expand_bad_parts():
    R, post, comb = torch.randn(2, 4, 8), torch.rand(2, 4), torch.rand(2, 4, 4)
    with pytest.raises(TypeError, match="non-empty tuple"):
        mhc.mhc_expand(R, (), post, comb)
    with pytest.raises(TypeError, match="non-empty tuple"):
        mhc.mhc_expand(R, (torch.randn(2, 8), 1.0), post, comb)
    with pytest.raises(ValueError, match="share one shape"):
        mhc.mhc_expand(R, (torch.randn(2, 8), torch.randn(2, 4)), post, comb)


def test_router_and_experts_textbook():
    g = torch.Generator().manual_seed(6)
    T, E, k, Dm, F = 3, 6, 2, 8, 5
    logits = torch.randn(T, E, generator=g, dtype=D)
    bias = torch.randn(E, generator=g, dtype=D) * 0.5
    w, ids = moe.route_topk(logits, bias, k, 1.5)
    for t in range(T):
        s = [math.sqrt(math.log1p(math.exp(v))) for v in logits[t].tolist()]
        order = sorted(range(E), key=lambda e: -(s[e] + bias[e].item()))[:k]
        assert set(ids[t].tolist()) == set(order)
        tot = sum(s[e] for e in order)
        for j, e in enumerate(ids[t].tolist()):
            assert abs(w[t, j].item() - s[e] / tot * 1.5) < 1e-6
    hw, hids = moe.route_hash(logits, torch.tensor([[0, 1], [2, 3], [4, 5]]), 1.0)
    assert hids.tolist() == [[0, 1], [2, 3], [4, 5]]
    torch.testing.assert_close(hw.sum(-1), torch.ones(T, dtype=hw.dtype))
    x = torch.randn(T, Dm, generator=g, dtype=D)
    w1, w3 = torch.randn(E, F, Dm, generator=g, dtype=D), torch.randn(E, F, Dm, generator=g, dtype=D)
    w2 = torch.randn(E, Dm, F, generator=g, dtype=D)
    out = moe.experts_dense(x, w, ids, w1, w3, w2, 1.0)
    silu = lambda v: v / (1 + math.exp(-v))
    for t in range(T):
        acc = torch.zeros(Dm, dtype=D)
        for j, e in enumerate(ids[t].tolist()):
            gt, up = w1[e] @ x[t], w3[e] @ x[t]
            h = torch.tensor([silu(min(a, 1.0)) * min(max(b, -1.0), 1.0) for a, b in zip(gt.tolist(), up.tolist())], dtype=D)
            acc += w[t, j].double() * (w2[e] @ h)
        torch.testing.assert_close(out[t], acc)
