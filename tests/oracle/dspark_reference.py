"""An independent reference of the DeepSeek-V4.1 DSpark draft, written from MODEL_SPEC.md 3.12 and
ENGINE_FEATURES.md 1.2-1.3: plain torch on one request at a time, dense (the context KV of every
position is recomputed), no paging, no kernel registry, nothing from deepinfer_core/_models.

It builds on the V4.1 oracle (``tests/oracle/v41_reference.py``) for the target stream taps and
the shared math pieces (RMSNorm, RoPE, mHC mix/post/collapse).

Usage: ``RefDSpark(model_dir).propose(context_tokens, anchor, n, noise_id)`` -> dict with the
base logits ``U [N, V]``, Markov-adjusted ``logits [N, V]``, ``tokens [N]``, ``confidence [N]``.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import torch
import torch.nn.functional as F

from tests.oracle.v41_reference import E2M1, RefV41, hc_collapse, hc_mix, hc_post, inv_freq, rms, rope, ue8m0


def read_mtp_weights(model_dir: Path, cfg: dict) -> dict[str, torch.Tensor]:
    """``mtp.*`` tensors as float64, quantised ones dequantised (FP8 32x32 blocks, MXFP4 per 32)."""
    from safetensors.torch import load_file

    raw: dict[str, torch.Tensor] = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        raw.update({k: v for k, v in load_file(str(f)).items() if k.startswith("mtp.")})
    bn, bk = (cfg.get("quantization_config") or {}).get("weight_block_size", [32, 32])
    out = {}
    for name, t in raw.items():
        if name.endswith(".scale"):
            continue
        scale = raw.get(name[: -len(".weight")] + ".scale")
        if scale is None:
            out[name] = t.to(torch.float64)
        elif t.dtype == torch.float8_e4m3fn:
            n, k = t.shape
            out[name] = t.to(torch.float64) * ue8m0(scale).repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
        else:
            b = t.view(torch.uint8).to(torch.long)
            lut = torch.tensor(E2M1, dtype=torch.float64)
            vals = torch.stack([lut[b & 15], lut[b >> 4]], dim=-1).reshape(b.shape[0], -1)
            out[name] = vals * ue8m0(scale).repeat_interleave(32, dim=1)
    return out


def noise(seed: int, position: int, vocab: int) -> torch.Tensor:
    """Exp(1) noise of the draft at query ``position`` (spec: keyed by (seed, position), draft salt)."""
    h = hashlib.blake2b(f"deepinfer.dspark.draft:{seed}:{position}".encode(), digest_size=8).digest()
    g = torch.Generator().manual_seed(int.from_bytes(h, "little") & ((1 << 63) - 1))
    return torch.empty(vocab, dtype=torch.float32).exponential_(generator=g)


class RefDSpark(RefV41):
    def __init__(self, model_dir, dtype: torch.dtype = torch.float64):
        super().__init__(model_dir, dtype)
        mw = read_mtp_weights(self.dir, self.cfg)
        self.m = {k: v.to(dtype) for k, v in mw.items()}
        self.nl = self.cfg["num_hidden_layers"]
        self.stages = self.cfg.get("n_mtp_layers", 3)

    def M(self, rest: str) -> torch.Tensor:
        """A DSpark head tensor, wherever its stage is."""
        hits = [v for k, v in self.m.items() if k.split(".", 2)[2] == rest]
        assert len(hits) <= 1, rest
        return hits[0] if hits else None

    # -- target taps: mean over hc streams of the stream entering layer L (after Engram)
    @torch.no_grad()
    def taps(self, tokens: list[int]) -> dict[int, torch.Tensor]:
        c = self.cfg
        want = set(c["dspark_target_layer_ids"])
        n, eps, heps, it = c["hc_mult"], c["rms_norm_eps"], c["hc_eps"], c["hc_sinkhorn_iters"]
        R = self.W("embed.weight")[torch.tensor(tokens)][:, None, :].repeat(1, n, 1)
        kv_cache, topk_of, out = {}, {}, {}
        pre_prev = y_f = post_f = comb_f = None
        for L in range(self.nl):
            hc = lambda sub: [self.W(f"layers.{L}.hc_{sub}_{x}") for x in ("fn", "base", "scale")]  # noqa: E731
            if L > 0:
                R = hc_post(R, y_f, post_f, comb_f)
            if L in self.eng_ids:
                R = self.engram(R, L, tokens)
            if L in want:
                out[L] = R.mean(1)
            pre_a, post_a, comb_a = hc_mix(R, *hc("attn"), n, eps, heps, it)
            xin = R[:, 0] if L == 0 else hc_collapse(R, pre_prev)
            y_a = self.attention(rms(xin, self.W(f"layers.{L}.attn_norm.weight"), eps), L, kv_cache, topk_of)
            R = hc_post(R, y_a, post_a, comb_a)
            pre_f, post_f, comb_f = hc_mix(R, *hc("ffn"), n, eps, heps, it)
            y_f = self.moe(rms(hc_collapse(R, pre_a), self.W(f"layers.{L}.ffn_norm.weight"), eps), L)
            pre_prev = pre_f
        return out

    # -- draft pieces
    def mlin(self, x, name):
        return x @ self.m[name + ".weight"].T

    def draft_attention(self, x, i, pos, ctx_kv):
        """x [N, D] normed block input at positions pos [N]; ctx_kv [C, d] the visible context KV."""
        c = self.cfg
        p = f"mtp.{i}.attn"
        N, H, d, eps = x.shape[0], c["num_attention_heads"], c["head_dim"], c["rms_norm_eps"]
        freq = inv_freq(c, False).to(self.dt)
        q = self.mlin(rms(self.mlin(x, f"{p}.wq_a"), self.m[f"{p}.q_norm.weight"], eps), f"{p}.wq_b").view(N, H, d)
        q = rope(q, pos, freq)
        kv = rope(rms(self.mlin(x, f"{p}.wkv"), self.m[f"{p}.kv_norm.weight"], eps), pos, freq)
        keys = torch.cat([ctx_kv, kv])  # every block token sees all of these (non-causal block)
        logits = torch.einsum("thd,jd->thj", q, keys) * d ** -0.5
        sink = self.m[f"{p}.attn_sink"].view(1, H, 1).expand(N, H, 1)
        prob = torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :-1]
        o = rope(torch.einsum("thj,jd->thd", prob, keys), pos, freq, sign=-1.0)
        G = c["o_groups"]
        wo_a = self.m[f"{p}.wo_a.weight"].view(G, c["o_lora_rank"], H * d // G)
        z = torch.einsum("tgk,gok->tgo", o.reshape(N, G, -1), wo_a).reshape(N, -1)
        return self.mlin(z, f"{p}.wo_b")

    def draft_moe(self, x, i):
        c = self.cfg
        p = f"mtp.{i}.ffn"
        lim = c["swiglu_limit"]
        ne = c.get("dspark_n_routed_experts") or c["n_routed_experts"]
        topk = c.get("dspark_num_experts_per_tok") or c["num_experts_per_tok"]

        def expert(xx, pre):
            h = F.silu(self.mlin(xx, f"{pre}.w1").clamp(max=lim)) * self.mlin(xx, f"{pre}.w3").clamp(-lim, lim)
            return self.mlin(h, f"{pre}.w2")

        s = torch.sqrt(F.softplus(self.mlin(x, f"{p}.gate")))
        sel = (s + self.m[f"{p}.gate.bias"]).topk(topk, dim=-1).indices
        wts = s.gather(1, sel)
        wts = wts / wts.sum(-1, keepdim=True) * c["routed_scaling_factor"]
        out = torch.zeros_like(x)
        for e in range(ne):
            if bool((sel == e).any()):
                out = out + (wts * (sel == e)).sum(-1)[:, None] * expert(x, f"{p}.experts.{e}")
        if c.get("n_shared_experts", 1):
            out = out + expert(x, f"{p}.shared_experts")
        return out

    @torch.no_grad()
    def propose(self, context: list[int], anchor: int, n: int, noise_id: int, seed: int | None = None,
                temperature: float = 1.0) -> dict[str, torch.Tensor]:
        c = self.cfg
        P, W = len(context), c["sliding_window"]
        eps, hm, heps, it = c["rms_norm_eps"], c["hc_mult"], c["hc_eps"], c["hc_sinkhorn_iters"]
        taps = self.taps(context)
        feat = torch.cat([taps[L] for L in c["dspark_target_layer_ids"]], dim=-1)
        main_x = rms(feat @ self.M("main_proj.weight").T, self.M("main_norm.weight"), eps)  # [P, D]
        ctx_pos = torch.arange(P)
        freq = inv_freq(c, False).to(self.dt)
        lo = max(P - W, 0)
        ctx_kv = [rope(rms(self.mlin(main_x, f"mtp.{i}.attn.wkv"), self.m[f"mtp.{i}.attn.kv_norm.weight"], eps),
                       ctx_pos, freq)[lo:P] for i in range(self.stages)]
        ids = torch.tensor([anchor] + [noise_id] * (n - 1))
        pos = torch.arange(P, P + n)
        R = self.W("embed.weight")[ids][:, None, :].repeat(1, hm, 1)
        pre_prev = y_f = post_f = comb_f = None
        for i in range(self.stages):
            hc = lambda sub: [self.m[f"mtp.{i}.hc_{sub}_{x}"] for x in ("fn", "base", "scale")]  # noqa: E731
            if i > 0:
                R = hc_post(R, y_f, post_f, comb_f)
            pre_a, post_a, comb_a = hc_mix(R, *hc("attn"), hm, eps, heps, it)
            xin = R[:, 0] if i == 0 else hc_collapse(R, pre_prev)
            y_a = self.draft_attention(rms(xin, self.m[f"mtp.{i}.attn_norm.weight"], eps), i, pos, ctx_kv[i])
            R = hc_post(R, y_a, post_a, comb_a)
            pre_f, post_f, comb_f = hc_mix(R, *hc("ffn"), hm, eps, heps, it)
            y_f = self.draft_moe(rms(hc_collapse(R, pre_a), self.m[f"mtp.{i}.ffn_norm.weight"], eps), i)
            pre_prev = pre_f
        R = hc_post(R, y_f, post_f, comb_f)
        h = hc_collapse(R, pre_prev)  # pre-norm head hidden [N, D]
        U = rms(h, self.M("norm.weight"), eps) @ self.W("head.weight").T
        emb, head = self.M("markov_head.embed.weight"), self.M("markov_head.head.weight")
        prev, toks, logits, prevs = anchor, [], [], []
        for k in range(n):
            prevs.append(prev)
            lk = U[k] + head @ emb[prev]
            logits.append(lk)
            if seed is None:
                t = int(lk.argmax())
            else:
                t = int((lk / temperature - noise(seed, P + k, lk.shape[0]).to(lk.dtype).log()).argmax())
            toks.append(t)
            prev = t
        conf = None
        cw = self.M("confidence_head.proj.weight")
        if cw is not None:
            conf = torch.sigmoid(torch.cat([h, emb[torch.tensor(prevs)]], dim=-1) @ cw.T)[:, 0]
        return {"U": U.float(), "logits": torch.stack(logits).float(), "tokens": torch.tensor(toks),
                "confidence": None if conf is None else conf.float(), "main_x": main_x.float(), "h": h.float()}
