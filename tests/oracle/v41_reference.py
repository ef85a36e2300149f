"""An independent full-sequence reference of DeepSeek-V4.1 (text), written from MODEL_SPEC.md.

Deliberately naive and self-contained: plain torch on one whole sequence, dense masks, no
paging, no kernel registry, and nothing imported from ``deepinfer_core`` / ``deepinfer_models``
(config flattening, dequantisation, RoPE, mHC, the compressor, the indexer with the
candidate filter, the MoE and Engram hashing are all re-derived here). It is the oracle the
paged model is compared with (tests/models/test_v41_model.py).

Usage: ``RefV41(model_dir).logits(token_ids)`` -> fp32 ``[T, vocab]`` teacher-forced logits.
"""
from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


# -- checkpoint ---------------------------------------------------------------------------
def read_config(model_dir: Path) -> dict:
    raw = json.loads((model_dir / "config.json").read_text())
    cfg = {k: v for k, v in raw.items() if k != "text_config"}
    cfg.update({k: v for k, v in (raw.get("text_config") or {}).items() if k != "model_type"})
    return cfg


def ue8m0(s: torch.Tensor) -> torch.Tensor:
    return torch.exp2(s.view(torch.uint8).to(torch.float64) - 127.0)


def read_weights(model_dir: Path, cfg: dict) -> dict[str, torch.Tensor]:
    """name -> float64 tensor; quantised weights dequantised, ``.scale`` tensors consumed."""
    from safetensors.torch import load_file

    raw: dict[str, torch.Tensor] = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        raw.update(load_file(str(f)))
    bn, bk = (cfg.get("quantization_config") or {}).get("weight_block_size", [32, 32])
    out = {}
    for name, t in raw.items():
        if name.endswith(".scale") or name.startswith("mtp."):
            continue
        base = name[: -len(".weight")]
        scale = raw.get(base + ".scale")
        if scale is None:
            out[name] = t.to(torch.float64)
        elif t.dtype == torch.float8_e4m3fn and name.endswith("engram.embed.weight"):
            out[name] = t.to(torch.float64) * ue8m0(scale).repeat_interleave(32, dim=1)
        elif t.dtype == torch.float8_e4m3fn:
            n, k = t.shape
            s = ue8m0(scale).repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
            out[name] = t.to(torch.float64) * s
        else:  # MXFP4: byte j = elements 2j (low nibble), 2j+1 (high nibble); one scale per 32 along K
            b = t.view(torch.uint8).to(torch.long)
            lut = torch.tensor(E2M1, dtype=torch.float64)
            vals = torch.stack([lut[b & 15], lut[b >> 4]], dim=-1).reshape(b.shape[0], -1)
            out[name] = vals * ue8m0(scale).repeat_interleave(32, dim=1)
    return out


# -- Engram constants -------------------------------------------------------------------------
def _prime(n: int) -> bool:
    if n < 2:
        return False
    i = 2
    while i * i <= n:
        if n % i == 0:
            return False
        i += 1
    return True


def engram_layout(cfg: dict) -> tuple[list[list[int]], list[list[int]]]:
    """(primes, offsets) per Engram layer, columns ordered (n-gram size, head)."""
    used: set[int] = set()
    primes = []
    for _ in cfg["engram_layer_ids"]:
        cols = []
        for _n in range(cfg["engram_max_ngram_size"] - 1):
            c = cfg["engram_vocab_size"] - 1
            for _h in range(cfg["engram_n_heads"]):
                c += 1
                while c in used or not _prime(c):
                    c += 1
                used.add(c)
                cols.append(c)
        primes.append(cols)
    offsets = [[sum(cols[:i]) for i in range(len(cols))] for cols in primes]
    return primes, offsets


@functools.lru_cache(maxsize=4)
def engram_token_map(tokenizer_json: Path) -> tuple[list[int], int]:
    import tokenizers
    from tokenizers import Regex, normalizers

    tok = tokenizers.Tokenizer.from_file(str(tokenizer_json))
    norm = normalizers.Sequence([
        normalizers.NFKC(), normalizers.NFD(), normalizers.StripAccents(), normalizers.Lowercase(),
        normalizers.Replace(Regex(r"[ \t\r\n]+"), " "), normalizers.Replace(Regex(r"^ $"), "\ue000"),
        normalizers.Strip(), normalizers.Replace("\ue000", " ")])
    keys: dict[str, int] = {}
    out = []
    for i in range(tok.get_vocab_size(with_added_tokens=True)):
        text = tok.decode([i], skip_special_tokens=False)
        key = tok.id_to_token(i) if "\ufffd" in text else (norm.normalize_str(text) or text)
        out.append(keys.setdefault(key, len(keys)))
    return out, len(keys)


def engram_multipliers(layer_ids, n: int, vc: int) -> list[list[int]]:
    hi = max(1, ((2 ** 63 - 1) // vc) // 2)
    return [[int(v) * 2 + 1 for v in np.random.default_rng(10007 * L).integers(0, hi, size=n, dtype=np.int64)]
            for L in layer_ids]


def engram_hash_ids(tokens: list[int], tmap: list[int], pad: int, mult: list[int], primes: list[int],
                    offsets: list[int], n: int, heads: int) -> list[list[int]]:
    """Python-int hash ids [T][(n-1)*heads] of one Engram layer (MODEL_SPEC.md 3.9 pseudo-code)."""
    out = []
    for p in range(len(tokens)):
        rolling, blocked, row = 0, False, [0] * ((n - 1) * heads)
        for s in range(n):
            blocked = blocked or p - s < 0
            v = pad if blocked else tmap[tokens[p - s]]
            rolling ^= v * mult[s]
            if s >= 1:
                for h in range(heads):
                    c = (s - 1) * heads + h
                    row[c] = rolling % primes[c] + offsets[c]
        out.append(row)
    return out


# -- math pieces ----------------------------------------------------------------------------------
def rms(x, w, eps):
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if w is None else y * w


def inv_freq(cfg: dict, compressed: bool) -> torch.Tensor:
    rd = cfg["qk_rope_head_dim"]
    base = cfg["compress_rope_theta"] if compressed else cfg["rope_theta"]
    f = torch.tensor([base ** (-2 * i / rd) for i in range(rd // 2)], dtype=torch.float64)
    rs = cfg.get("rope_scaling") or {}
    if not compressed or rs.get("type", rs.get("rope_type")) != "yarn":
        return f
    L0 = rs.get("original_max_position_embeddings", cfg["max_position_embeddings"])

    def cdim(rot):
        return rd * math.log(L0 / (2 * math.pi * rot)) / (2 * math.log(base))

    lo = max(math.floor(cdim(rs.get("beta_fast", 32))), 0)
    hi = min(math.ceil(cdim(rs.get("beta_slow", 1))), rd - 1)
    if lo == hi:
        hi += 0.001
    ramp = ((torch.arange(rd // 2, dtype=torch.float64) - lo) / (hi - lo)).clamp(0, 1)
    return f / rs["factor"] * ramp + f * (1 - ramp)


def rope(x: torch.Tensor, pos: torch.Tensor, freq: torch.Tensor, sign: float = 1.0) -> torch.Tensor:
    """Rotate adjacent pairs of the last 2*len(freq) channels of x [T, ..., d] at positions pos [T]."""
    rd = 2 * freq.shape[0]
    ang = pos.to(torch.float64)[:, None] * freq[None, :]
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (rd // 2,)
    c, s = ang.cos().view(shape).to(x.dtype), (sign * ang.sin()).view(shape).to(x.dtype)
    a, b = x[..., -rd::2], x[..., -rd + 1::2]
    rot = torch.stack([a * c - b * s, b * c + a * s], dim=-1).flatten(-2)
    return torch.cat([x[..., :-rd], rot], dim=-1)


def hc_mix(R, fn, base, scale, n, eps, hc_eps, iters):
    T = R.shape[0]
    flat = R.reshape(T, -1)
    m = (flat * torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + eps)) @ fn.T
    pre = torch.sigmoid(m[:, :n] * scale[0] + base[:n]) + hc_eps
    post = 2 * torch.sigmoid(m[:, n:2 * n] * scale[1] + base[n:2 * n])
    c = torch.softmax(m[:, 2 * n:].view(T, n, n) * scale[2] + base[2 * n:].view(n, n), dim=-1) + hc_eps
    c = c / (c.sum(-2, keepdim=True) + hc_eps)
    for _ in range(iters - 1):
        c = c / (c.sum(-1, keepdim=True) + hc_eps)
        c = c / (c.sum(-2, keepdim=True) + hc_eps)
    return pre, post, c


def hc_post(R, y, post, comb):  # R'[:, j] = post_j y + sum_i comb[i, j] R[:, i]
    return post[..., None] * y[:, None, :] + torch.einsum("tij,tid->tjd", comb, R)


def hc_collapse(R, pre):
    return (pre[..., None] * R).sum(1)


def topk_set(scores: torch.Tensor, k: int) -> torch.Tensor:
    """bool [T, N]: the k best entries of each row, never a -inf one."""
    kk = min(k, scores.shape[1])
    sel = torch.zeros_like(scores, dtype=torch.bool)
    if kk == 0:
        return sel
    v, i = scores.topk(kk, dim=-1)
    sel.scatter_(1, i, v > float("-inf"))  # +inf (a forced block) counts, -inf never
    return sel


# -- the model ------------------------------------------------------------------------------------
class RefV41:
    def __init__(self, model_dir: str | Path, dtype: torch.dtype = torch.float32):
        self.dir = Path(model_dir)
        self.cfg = read_config(self.dir)
        self.dt = dtype
        self.w = {k: v.to(dtype) for k, v in read_weights(self.dir, self.cfg).items()}
        c = self.cfg
        self.ratios = list(c.get("compress_ratios") or [])
        self.eng_ids = list(c.get("engram_layer_ids") or [])
        if self.eng_ids:
            self.tmap, vc = engram_token_map(self.dir / "tokenizer.json")
            assert vc == c["engram_compressed_vocab_size"]
            self.primes, self.offsets = engram_layout(c)
            self.mult = engram_multipliers(self.eng_ids, c["engram_max_ngram_size"], vc)

    def ratio(self, L):
        return self.ratios[L] if L < len(self.ratios) else 0

    def W(self, name):
        return self.w[name]

    def lin(self, x, name):
        return x @ self.w[name + ".weight"].T

    # -- Engram
    def engram(self, R, L, tokens):
        c, li = self.cfg, self.eng_ids.index(L)
        n, heads = c["engram_max_ngram_size"], c["engram_n_heads"]
        pad = self.tmap[c["engram_pad_token_id"]]
        ids = torch.tensor(engram_hash_ids(tokens, self.tmap, pad, self.mult[li], self.primes[li], self.offsets[li],
                                           n, heads))
        table = self.W(f"layers.{L}.engram.embed.weight")
        e = table[ids].reshape(len(tokens), -1)
        kv = self.lin(e, f"layers.{L}.engram.wkv")
        D, nh = c["hidden_size"], c["hc_mult"]
        qw, kw = self.W(f"layers.{L}.engram.q_weight"), self.W(f"layers.{L}.engram.k_weight")
        val = kv[:, nh * D:]
        out = []
        for k in range(nh):
            h, key = R[:, k], kv[:, k * D:(k + 1) * D]
            dot = (h * qw[k] * kw[k] * key).sum(-1) * torch.rsqrt(h.pow(2).mean(-1) + c["rms_norm_eps"]) \
                * torch.rsqrt(key.pow(2).mean(-1) + c["rms_norm_eps"]) / math.sqrt(D)
            g = torch.sigmoid(torch.where(dot < 0, -1.0, 1.0) * dot.abs().clamp(min=1e-6).sqrt())
            out.append(h + g[:, None] * val)
        return torch.stack(out, dim=1)

    # -- compressed branch of a kv source: entries (RoPE'd) and the pre-RoPE latents
    def compress(self, x, L):
        c, r = self.cfg, self.ratio(L)
        p = f"layers.{L}.attn"
        kv = self.lin(x, f"{p}.compressor.wkv")
        if r == 1:
            u = kv
        else:
            z = self.lin(x, f"{p}.compressor.wgate")
            G = x.shape[0] // 2
            ze, zo = z[0:2 * G:2], z[1:2 * G:2]
            a = torch.exp(ze) / (torch.exp(ze) + torch.exp(zo))
            u = a * kv[0:2 * G:2] + (1 - a) * kv[1:2 * G:2]
        latent = rms(u, self.W(f"{p}.compressor.norm.weight"), c["rms_norm_eps"])
        at = torch.arange(latent.shape[0]) * r
        entries = rope(latent, at, inv_freq(c, True).to(self.dt))
        keys = None
        if L in c["index_source_layer_ids"]:
            k = rms(self.lin(latent, f"{p}.indexer.wk"), self.W(f"{p}.indexer.k_norm.weight"), c["rms_norm_eps"])
            keys = rope(k, at, inv_freq(c, True).to(self.dt))
        return entries, keys

    def index_scores(self, x, qr, L, keys):
        c = self.cfg
        p = f"layers.{L}.attn.indexer"
        T, Hi, Di = x.shape[0], c["index_n_heads"], c["index_head_dim"]
        q = rope(self.lin(qr, f"{p}.wq_b").view(T, Hi, Di), torch.arange(T), inv_freq(c, True).to(self.dt))
        w = self.lin(x, f"{p}.weights_proj") * Di ** -0.5 * Hi ** -0.5
        s = (torch.relu(torch.einsum("thd,gd->thg", q, keys)) * w[:, :, None]).sum(1)  # [T, G]
        r = self.ratio(L)
        vis = torch.arange(keys.shape[0])[None, :] < ((torch.arange(T) + 1) // r)[:, None]
        return s.masked_fill(~vis, float("-inf")), vis

    def candidates(self, s, vis):
        """bool [T, G]: entries inside the source's top candidate blocks (newest block forced)."""
        c = self.cfg
        bs, kb = c["candidate_block_size"], c["candidate_topk_blocks"]
        T, G = s.shape
        nb = -(-G // bs)
        padded = torch.full((T, nb * bs), float("-inf"), dtype=s.dtype)
        padded[:, :G] = s
        bmax = padded.view(T, nb, bs).amax(-1)
        nvis = vis.sum(1)
        for t in range(T):
            if nvis[t] > 0:
                bmax[t, (nvis[t] - 1) // bs] = float("inf")
        keep_blocks = topk_set(bmax, kb)
        return keep_blocks.repeat_interleave(bs, dim=1)[:, :G]

    def attention(self, x, L, kv_cache, topk_of):
        c = self.cfg
        p = f"layers.{L}.attn"
        T, H, d = x.shape[0], c["num_attention_heads"], c["head_dim"]
        r = self.ratio(L)
        freq = inv_freq(c, r > 0).to(self.dt)
        pos = torch.arange(T)
        eps = c["rms_norm_eps"]
        qr = rms(self.lin(x, f"{p}.wq_a"), self.W(f"{p}.q_norm.weight"), eps)
        q = self.lin(qr, f"{p}.wq_b").view(T, H, d)
        if c.get("q_head_norm", False):
            q = rms(q, None, eps)
        q = rope(q, pos, freq)
        kv = rope(rms(self.lin(x, f"{p}.wkv"), self.W(f"{p}.kv_norm.weight"), eps), pos, freq)
        if L in c["kv_source_layer_ids"]:
            kv_cache[L] = self.compress(x, L)
        if L in c["index_source_layer_ids"]:
            owner = max(s for s in c["kv_source_layer_ids"] if s <= L)
            s, vis = self.index_scores(x, qr, L, kv_cache[owner][1])
            cs = c.get("candidate_source_layer_id", -1)
            if L == cs:
                self._cand = self.candidates(s, vis)
            elif 0 <= cs < L:
                s = s.masked_fill(~self._cand, float("-inf"))
            topk_of[L] = topk_set(s, c["index_topk"])
        j = torch.arange(T)
        swa_ok = (j[None, :] <= pos[:, None]) & (j[None, :] > pos[:, None] - c["sliding_window"])
        logits = torch.einsum("thd,jd->thj", q, kv) * d ** -0.5
        logits = logits.masked_fill(~swa_ok[:, None, :], float("-inf"))
        vals = [kv]
        if r:
            src = max(s for s in c["kv_source_layer_ids"] if s <= L)
            idx = max(s for s in c["index_source_layer_ids"] if s <= L)
            entries = kv_cache[src][0]
            sel = topk_of[idx]
            cl = torch.einsum("thd,gd->thg", q, entries) * d ** -0.5
            logits = torch.cat([logits, cl.masked_fill(~sel[:, None, :], float("-inf"))], dim=-1)
            vals.append(entries)
        sink = self.W(f"{p}.attn_sink").view(1, H, 1).expand(T, H, 1)
        full = torch.cat([logits, sink], dim=-1)
        prob = torch.softmax(full, dim=-1)[..., :-1]
        o = torch.einsum("thj,jd->thd", prob, torch.cat(vals, dim=0))
        o = rope(o, pos, freq, sign=-1.0)
        G = c["o_groups"]
        wo_a = self.W(f"{p}.wo_a.weight").view(G, c["o_lora_rank"], H * d // G)
        z = torch.einsum("tgk,gok->tgo", o.reshape(T, G, -1), wo_a).reshape(T, -1)
        return self.lin(z, f"{p}.wo_b")

    def moe(self, x, L):
        c = self.cfg
        p = f"layers.{L}.ffn"
        lim = c["swiglu_limit"]

        def expert(xx, pre):
            h = F.silu(self.lin(xx, f"{pre}.w1").clamp(max=lim)) * self.lin(xx, f"{pre}.w3").clamp(-lim, lim)
            return self.lin(h, f"{pre}.w2")

        s = torch.sqrt(F.softplus(self.lin(x, f"{p}.gate")))
        sel = (s + self.W(f"{p}.gate.bias")).topk(c["num_experts_per_tok"], dim=-1).indices
        wts = s.gather(1, sel)
        wts = wts / wts.sum(-1, keepdim=True) * c["routed_scaling_factor"]
        out = torch.zeros_like(x)
        for e in range(c["n_routed_experts"]):  # dense: every expert on every token, weight 0 if unrouted
            w_e = (wts * (sel == e)).sum(-1)
            if bool((sel == e).any()):
                out = out + w_e[:, None] * expert(x, f"{p}.experts.{e}")
        if c.get("n_shared_experts", 1):
            out = out + expert(x, f"{p}.shared_experts")
        return out

    @torch.no_grad()
    def logits(self, tokens: list[int]) -> torch.Tensor:
        c = self.cfg
        n, eps, heps, it = c["hc_mult"], c["rms_norm_eps"], c["hc_eps"], c["hc_sinkhorn_iters"]
        E = self.W("embed.weight")[torch.tensor(tokens)]
        R = E[:, None, :].repeat(1, n, 1)
        kv_cache, topk_of = {}, {}
        pre_prev = y_f = post_f = comb_f = None
        for L in range(c["num_hidden_layers"]):
            hc = lambda sub: [self.W(f"layers.{L}.hc_{sub}_{x}") for x in ("fn", "base", "scale")]  # noqa: E731
            if L > 0:
                R = hc_post(R, y_f, post_f, comb_f)
            if L in self.eng_ids:
                R = self.engram(R, L, tokens)
            pre_a, post_a, comb_a = hc_mix(R, *hc("attn"), n, eps, heps, it)
            xin = R[:, 0] if L == 0 else hc_collapse(R, pre_prev)
            y_a = self.attention(rms(xin, self.W(f"layers.{L}.attn_norm.weight"), eps), L, kv_cache, topk_of)
            R = hc_post(R, y_a, post_a, comb_a)
            pre_f, post_f, comb_f = hc_mix(R, *hc("ffn"), n, eps, heps, it)
            y_f = self.moe(rms(hc_collapse(R, pre_a), self.W(f"layers.{L}.ffn_norm.weight"), eps), L)
            pre_prev = pre_f
        R = hc_post(R, y_f, post_f, comb_f)
        h = rms(hc_collapse(R, pre_prev), self.W("norm.weight"), eps)
        return (h @ self.W("head.weight").T).float()
