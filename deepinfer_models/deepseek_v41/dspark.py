"""DSpark draft model of DeepSeek-V4.1 (MODEL_SPEC.md 3.12, ENGINE_FEATURES.md 1.2-1.3): the
forward and the proposer math, not the engine integration (scheduling, verification).

One propose step, for B requests whose target has verified positions ``< P`` (per request):

1. ``combine(taps)``: target features. ``taps[l]`` is the hc-mean of the stream entering target
   layer ``dspark_target_layer_ids[l]`` (``DeepseekV41ForCausalLM.forward_with_taps``);
   ``main_x = main_norm(main_proj(concat_l taps[l]))`` per context position.
2. ``write_context_kv(main_x, ctx)``: for each draft layer, ``RoPE(kv_norm(wkv(main_x)))`` (main
   rope, no ``attn_norm``) into that layer's own SWA cache at the context positions.
3. ``forward_block(anchor, ctx)``: the N = ``num_draft_tokens`` query positions ``P..P+N-1``
   (anchor, then the noise token) through the draft stack: shared ``embed``, n hc copies, the
   ``n_mtp_layers`` V4.1 decoder layers (delayed mHC, ratio-0 attention, draft MoE sizes), the
   final collapse -> pre-norm head hidden ``h``. Attention of every block token sees context
   ``[max(P-W, 0), P)`` plus *all* block positions (non-causal inside the block).
4. ``sample``: base logits ``U_k = head(norm(h_k))``, then sequentially ``logits_k = U_k +
   markov_head.head(markov_head.embed[prev])``, prev = anchor, then each draft. Greedy rows take
   the argmax; seeded rows an exponential race whose noise is keyed by (seed, query position)
   with a draft-only salt.
5. confidence (optional weights): ``sigmoid(proj([h_k, markov_embed(prev_k)]))``.

Draft layers reuse ``AttentionV41`` / ``MoEV4`` unchanged: their ``mtp.{i}.*`` tensors are renamed
to backbone layer ``num_hidden_layers + i`` of a config whose draft layers are ratio 0 and whose
MoE sizes are the draft's. Their SWA caches equal the target's SWA spec, so they share its
paged group (one block table per request covers target and draft).
"""
from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch

from deepinfer_core.kernels.resolve import resolve_kernels
from deepinfer_core.kv.spec import KVCacheSpec, SlidingWindowSpec
from deepinfer_core.loader import CheckpointError, load_checkpoint
from deepinfer_core.runner.context import GroupMetadata, StepContext
from deepinfer_models.deepseek_v4.model import make_linear_factory, rope_tables
from deepinfer_models.deepseek_v4.moe import MoEV4, is_routed_expert
from deepinfer_models.deepseek_v41.attention import AttentionV41
from deepinfer_models.deepseek_v41.config import DeepseekV41Config
from deepinfer_models.deepseek_v41.hyper import HCLayer, run_delayed_mhc
from deepinfer_models.deepseek_v41.model import KERNEL_OPS as V41_KERNEL_OPS
from deepinfer_models.deepseek_v41.safetensors_index import stored_tensors
from deepinfer_models.deepseek_v41.step import IndexShare
from deepinfer_models.layers.static_index import write_rows
from deepinfer_models.deepseek_v41.weights import (
    MTP_OPTIONAL_HEADS,
    MTP_PREFIX,
    mtp_head_tensors,
    mtp_layer_tensors,
)

KERNEL_OPS = V41_KERNEL_OPS + ("sample.exponential_race",)
DRAFT_SALT = "deepinfer.dspark.draft"


class DSparkError(ValueError):
    """Bad DSpark weights, configuration or propose inputs."""


# -- weights ----------------------------------------------------------------------------------
def find_heads(cfg: DeepseekV41Config, names) -> dict[str, str]:
    """Head name without stage (``main_proj.weight``...) -> the stored ``mtp.{s}.`` name.

    Heads may sit on any stage (the loader checked each is stored once); the confidence head
    is optional, every other head is required."""
    heads = mtp_head_tensors(cfg)
    found: dict[str, str] = {}
    for name in names:
        parts = name.split(".", 2)
        if len(parts) == 3 and parts[0] + "." == MTP_PREFIX and parts[1].isdigit():
            rest = parts[2]
            if rest in heads:  # includes main_proj.scale on quantised checkpoints
                found[rest] = name
    for rest in heads:
        if rest not in found and rest not in MTP_OPTIONAL_HEADS:
            raise DSparkError(f"DSpark head tensor {MTP_PREFIX}<stage>.{rest} is missing")
    return found


def load_dspark_weights(model_dir: str | Path, cfg: DeepseekV41Config) -> dict[str, torch.Tensor]:
    """Read the ``mtp.*`` tensors of a V4.1 checkpoint (validated against ``weights.mtp_*``).

    Returns ``{native name: tensor}`` (memory-mapped, dtype as stored)."""
    from deepinfer_models.deepseek_v41.loading import validate_mtp

    stored = stored_tensors(model_dir)
    if not validate_mtp(cfg, stored):
        raise CheckpointError(f"{model_dir} has no DSpark (mtp.*) weights")
    wanted = dict(mtp_layer_tensors(cfg))
    heads = mtp_head_tensors(cfg)
    for rest, name in find_heads(cfg, stored).items():
        wanted[name] = heads[rest]
    skip = tuple(n for n in stored if n not in wanted)  # a full name is its own prefix
    return load_checkpoint(model_dir, wanted, skip_prefixes=skip, progress=False)


def draft_config(cfg: DeepseekV41Config) -> DeepseekV41Config:
    """The config the draft layers run under: backbone ratios only (draft layers are ratio 0),
    the draft MoE sizes, no compressed / Engram roles."""
    return dataclasses.replace(
        cfg, compress_ratios=tuple(cfg.compress_ratios[:cfg.num_hidden_layers]),
        n_routed_experts=cfg.draft_n_routed_experts, num_experts_per_tok=cfg.draft_num_experts_per_tok)


# -- sampling noise -----------------------------------------------------------------------------
def draft_noise(seed: int, position: int, vocab: int, device=None) -> torch.Tensor:
    """Exp(1) noise [vocab] fp32 of the draft sampled at query ``position`` of a request seeded
    ``seed``: a generator seeded from a hash of (salt, seed, position), so draft randomness is
    independent of batch layout and never equals the target sampler's (different salt)."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    digest = hashlib.blake2b(f"{DRAFT_SALT}:{seed}:{position}".encode(), digest_size=8).digest()
    g = torch.Generator(device="cpu").manual_seed(int.from_bytes(digest, "little") & ((1 << 63) - 1))
    q = torch.empty(vocab, dtype=torch.float32).exponential_(generator=g)
    return q if device is None else q.to(device)


@dataclass
class DSparkDrafts:
    """One propose step's output, B requests x N drafts.

    ``tokens [B, N]`` int64 (draft k is the proposal for position ``P+k+1``); ``logits [B, N, V]``
    fp32 Markov-adjusted, pre-temperature (the draft distribution for rejection sampling);
    ``base_logits [B, N, V]`` fp32 ``U_k``; ``confidence [B, N]`` fp32 or None (no head)."""

    tokens: torch.Tensor
    logits: torch.Tensor
    base_logits: torch.Tensor
    confidence: torch.Tensor | None


class DSparkDrafter:
    """The DSpark draft model on top of a loaded ``DeepseekV41ForCausalLM`` ``target`` (shares its
    ``embed``, ``head``, dtype, device and SWA cache layout). ``weights``: the ``mtp.*`` tensors
    (``load_dspark_weights``). ``num_draft_tokens``: N = ``dspark_block_size``;
    ``noise_token_id``: ``dspark_noise_token_id`` (neither is a config field here)."""

    kernel_ops = KERNEL_OPS

    def __init__(self, target, weights: dict[str, torch.Tensor], num_draft_tokens: int, noise_token_id: int,
                 platform=None, kernel_overrides: dict | None = None):
        cfg: DeepseekV41Config = target.cfg
        if isinstance(num_draft_tokens, bool) or not isinstance(num_draft_tokens, int) or num_draft_tokens < 1:
            raise DSparkError(f"num_draft_tokens (dspark_block_size) must be a positive int, got {num_draft_tokens!r}")
        if isinstance(noise_token_id, bool) or not isinstance(noise_token_id, int) \
                or not 0 <= noise_token_id < cfg.vocab_size:
            raise DSparkError(f"noise_token_id {noise_token_id!r} is not a token id (vocab {cfg.vocab_size})")
        if cfg.n_mtp_layers < 1:
            raise DSparkError("config has n_mtp_layers=0: there is no DSpark draft stack")
        if cfg.dspark_markov_rank <= 0:
            raise DSparkError("dspark_markov_rank must be > 0 (DSpark drafts need the Markov head)")
        if cfg.draft_vocab_size not in (0, cfg.vocab_size):
            raise DSparkError(f"draft_vocab_size={cfg.draft_vocab_size} != vocab_size={cfg.vocab_size}: a reduced "
                              "draft vocabulary is not supported (V4.1 drafts over the full vocabulary)")
        self.target_layer_ids = tuple(cfg.dspark_target_layer_ids)
        if not self.target_layer_ids:
            raise DSparkError("config field 'dspark_target_layer_ids' is empty: no target features to condition on")
        self.cfg, self.n, self.noise_id = cfg, num_draft_tokens, noise_token_id
        self.dtype, self.device = target.dtype, target.device
        self.k = resolve_kernels(self.kernel_ops, platform, kernel_overrides)
        self.embed, self.head = target.embed, target.head
        dcfg = draft_config(cfg)
        # rename: stage i -> backbone layer num_hidden_layers + i; heads -> "dspark.<name>"
        w: dict[str, torch.Tensor] = {}
        base = cfg.num_hidden_layers
        for name, t in weights.items():
            parts = name.split(".", 2)
            if len(parts) == 3 and parts[0] + "." == MTP_PREFIX and parts[1].isdigit():
                key = f"layers.{base + int(parts[1])}.{parts[2]}"
                # routed experts are stacked on the host by MoEV4, then moved (one device copy)
                w[key] = t if is_routed_expert(key) else t.to(self.device)
        for rest, name in find_heads(cfg, weights).items():
            w[f"dspark.{rest}"] = weights[name].to(self.device)
        missing = [n for n in mtp_layer_tensors(cfg) if n not in weights]
        if missing:
            raise DSparkError(f"{len(missing)} DSpark layer tensors missing, e.g. {missing[0]!r}")
        make_linear = make_linear_factory(w, dcfg, self.k, self.dtype)
        rope = rope_tables(dcfg, self.device)
        self.inv_freq = rope["main"]
        swa = target.layers[0]["attn"].swa_spec
        self.eps = cfg.rms_norm_eps
        self.main_proj = make_linear("dspark.main_proj")
        self.main_norm = w["dspark.main_norm.weight"].float()
        self.norm_w = w["dspark.norm.weight"].float()
        self.markov_embed = w["dspark.markov_head.embed.weight"].to(self.dtype)
        self.markov_head = w["dspark.markov_head.head.weight"].to(self.dtype)
        conf = w.get("dspark.confidence_head.proj.weight")
        self.conf_w = None if conf is None else conf.float()  # fp32 Linear (H + r) -> 1
        self.layers = []
        for i in range(cfg.n_mtp_layers):
            L = base + i
            self.layers.append({
                "attn_norm": w[f"layers.{L}.attn_norm.weight"].float(),
                "ffn_norm": w[f"layers.{L}.ffn_norm.weight"].float(),
                "hc": {sub: tuple(w[f"layers.{L}.hc_{sub}_{x}"].float() for x in ("fn", "base", "scale"))
                       for sub in ("attn", "ffn")},
                # apart: the context KV (write_context_kv) needs wkv alone, for every target step
                "attn": AttentionV41(dcfg, L, w, make_linear, rope, self.k, swa.block_size, swa.dtype,
                                     merge_projections=False),
                "ffn": MoEV4(dcfg, L, w, make_linear, self.k, self.dtype),
            })
        for layer in self.layers:
            a = layer["attn"]
            if a.ratio or a.compressor is not None or a.indexer is not None:  # draft_config guarantees this
                raise AssertionError("DSpark draft attention must be pure sliding window")

    # -- caches ---------------------------------------------------------------------------------
    def kv_cache_specs(self) -> dict[str, KVCacheSpec]:
        """One SWA cache per draft layer (``layers.{num_hidden_layers + i}.attn.swa``), equal to
        the target's SWA spec so the executor puts them in the target's SWA group."""
        out: dict[str, KVCacheSpec] = {}
        for layer in self.layers:
            out.update(layer["attn"].specs())
        return out

    # -- 1. target features -----------------------------------------------------------------------
    def combine(self, taps) -> torch.Tensor:
        """taps: ``{layer id: [T, D]}`` (as ``forward_with_taps`` returns) or a list in
        ``dspark_target_layer_ids`` order -> main_x [T, D] in ``dtype``."""
        if isinstance(taps, dict):
            miss = [L for L in self.target_layer_ids if taps.get(L) is None]
            if miss:
                raise DSparkError(f"target features for layers {miss} are missing (have {sorted(taps)})")
            taps = [taps[L] for L in self.target_layer_ids]
        if len(taps) != len(self.target_layer_ids):
            raise DSparkError(f"expected {len(self.target_layer_ids)} target features "
                              f"(dspark_target_layer_ids={list(self.target_layer_ids)}), got {len(taps)}")
        x = torch.cat([t.to(self.dtype) for t in taps], dim=-1)
        return self.k["norm.rms"](self.main_proj(x), self.main_norm, self.eps)

    # -- 2. context KV ----------------------------------------------------------------------------
    def write_context_kv(self, main_x: torch.Tensor, ctx: StepContext) -> None:
        """main_x [T, D] of the target step described by ``ctx`` (its positions, and write slots of
        the draft caches, which are -1 for rows that must not be written) -> draft SWA caches."""
        if main_x.shape[0] != ctx.positions.shape[0]:
            raise DSparkError(f"main_x has {main_x.shape[0]} rows but the step has {ctx.positions.shape[0]} tokens")
        k = self.k
        for layer in self.layers:
            a = layer["attn"]
            kv = k["norm.rms_rope"](a.wkv(main_x), a.kv_norm, self.eps, ctx.positions, self.inv_freq)
            cache, w = ctx.caches[a.swa_name], ctx.meta(a.swa_name).write_slots
            write_rows(cache, w, kv)  # rows with slot -1 are not written

    # -- 3. block forward -------------------------------------------------------------------------
    def block_context(self, ctx: StepContext) -> StepContext:
        """``ctx``: a step context of N tokens per request at positions P..P+N-1 (slices with
        ``num_tokens = N``; their block tables cover those positions). Returns a copy whose draft
        SWA read rows are the draft mask: context ``[max(P-W,0), P)`` then all block positions."""
        if ctx.slices:
            bad = [i for i, s in enumerate(ctx.slices) if s.num_tokens != self.n]
            if bad:
                raise DSparkError(f"every request of a draft block has {self.n} tokens; slices {bad} do not")
        elif ctx.positions.shape[0] != self.n * ctx.extras["seq_start"].shape[0]:  # a captured step: no slices
            raise DSparkError(f"a draft block step needs {self.n} tokens per request")
        groups = dict(ctx.groups)
        dev = ctx.positions.device
        for gid in {ctx.cache_group[layer["attn"].swa_name] for layer in self.layers}:
            meta = ctx.groups[gid]
            spec: SlidingWindowSpec = meta.spec
            bs, width = spec.block_size, spec.window + self.n
            # P and the block table of every request, from the context's device tensors (no host data,
            # so a captured graph runs this too)
            start, table = ctx.extras["seq_start"], ctx.extras["tables"][gid]
            q = start[:, None] - spec.window + torch.arange(width, device=dev)[None, :]  # [B, W + N]
            qc = q.clamp(min=0)
            rows = table.gather(1, qc // bs) * bs + qc % bs
            rows = torch.where(q >= 0, rows, torch.full_like(rows, -1))
            groups[gid] = GroupMetadata(spec, meta.write_slots, rows[ctx.token_seq])
        return dataclasses.replace(ctx, groups=groups)

    def forward_block(self, anchor_ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """anchor_ids [B] int64; ``ctx`` as for ``block_context`` (raw, not yet masked) ->
        pre-norm head hidden h [B*N, D] in ``dtype`` (rows request-major, block-order)."""
        k, cfg = self.k, self.cfg
        b = anchor_ids.shape[0]
        if b != ctx.extras["seq_start"].shape[0]:
            raise DSparkError(f"{b} anchor tokens for {ctx.extras['seq_start'].shape[0]} requests")
        bctx = self.block_context(ctx)
        ids = torch.full((b, self.n), self.noise_id, dtype=torch.long, device=anchor_ids.device)
        ids[:, 0] = anchor_ids
        ids = ids.reshape(-1).to(self.device)
        share = IndexShare()
        stack = [HCLayer(
            hc_attn=layer["hc"]["attn"], hc_ffn=layer["hc"]["ffn"], attn_norm=layer["attn_norm"],
            ffn_norm=layer["ffn_norm"], attn=lambda h, a=layer["attn"]: a(h, bctx, None, share),
            ffn=lambda h, f=layer["ffn"]: f.parts(h, ids),
        ) for layer in self.layers]
        x = self.embed[ids]
        residual = x.unsqueeze(1).expand(-1, cfg.hc_mult, -1).contiguous()
        return run_delayed_mhc(residual, stack, k, self.eps, cfg.hc_eps, cfg.hc_sinkhorn_iters)

    def base_logits(self, h: torch.Tensor) -> torch.Tensor:
        """h [M, D] pre-norm -> U [M, V] fp32 = head(norm(h)) (the last stage's norm, shared head)."""
        return self.k["gemm.dense"](self.k["norm.rms"](h, self.norm_w, self.eps), self.head).float()

    # -- 4./5. Markov sampling and confidence -----------------------------------------------------
    def markov_bias(self, prev: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """prev [B] token ids -> (embed rows [B, r] in ``dtype``, logit bias [B, V] fp32)."""
        e = self.markov_embed[prev]
        return e, self.k["gemm.dense"](e, self.markov_head).float()

    def sample(self, h: torch.Tensor, anchor_ids: torch.Tensor, positions: torch.Tensor,
               seeds: list[int | None] | None = None, temperatures: list[float] | None = None) -> DSparkDrafts:
        """h [B*N, D] (``forward_block``), anchor_ids [B], positions [B] (P of each request).

        ``seeds[b]`` None (or ``seeds`` None): greedy draft (argmax); an int: draft by exponential
        race of ``softmax(logits / temperatures[b])`` with ``draft_noise(seed, P+k)``."""
        b, n = anchor_ids.shape[0], self.n
        if h.shape[0] != b * n:
            raise DSparkError(f"h has {h.shape[0]} rows, expected B*N = {b}*{n}")
        seeds = [None] * b if seeds is None else list(seeds)
        temps = [1.0] * b if temperatures is None else list(temperatures)
        if len(seeds) != b or len(temps) != b:
            raise DSparkError(f"seeds / temperatures need one entry per request ({b})")
        for t in temps:
            if not t > 0:
                raise DSparkError(f"draft temperature must be > 0 (greedy rows have seed None), got {t}")
        base = self.base_logits(h).view(b, n, -1)
        prev = anchor_ids.to(self.device)
        pos = [int(p) for p in positions.tolist()] if any(x is not None for x in seeds) else []
        tokens = torch.empty(b, n, dtype=torch.long, device=self.device)
        logits = torch.empty_like(base)
        embs = []
        seeded = [i for i, s in enumerate(seeds) if s is not None]
        if seeded:  # host data goes up only for sampled drafts: greedy blocks run inside captured graphs
            idx = torch.tensor(seeded, dtype=torch.long, device=self.device)
            temp_t = torch.tensor([temps[i] for i in seeded], dtype=torch.float32, device=self.device)[:, None]
        for j in range(n):
            e, bias = self.markov_bias(prev)
            embs.append(e)
            lj = base[:, j] + bias
            logits[:, j] = lj
            tok = lj.argmax(dim=-1)
            if seeded:
                q = torch.stack([draft_noise(seeds[i], pos[i] + j, lj.shape[-1], self.device) for i in seeded])
                tok[idx] = self.k["sample.exponential_race"](lj[idx] / temp_t, q)
            tokens[:, j] = tok
            prev = tok
        conf = None
        if self.conf_w is not None:
            feat = torch.cat([h.float(), torch.stack(embs, dim=1).reshape(b * n, -1).float()], dim=-1)
            z = self.k["gemm.dense"](feat, self.conf_w)[:, 0]
            conf = torch.sigmoid(z.double()).float().view(b, n)  # fp64 sigmoid: batch invariant
        return DSparkDrafts(tokens=tokens, logits=logits, base_logits=base, confidence=conf)

    def propose(self, anchor_ids: torch.Tensor, ctx: StepContext, seeds=None, temperatures=None) -> DSparkDrafts:
        """Block forward + sampling for the requests of ``ctx`` (see ``forward_block``)."""
        h = self.forward_block(anchor_ids, ctx)
        positions = torch.tensor([s.start_pos for s in ctx.slices], dtype=torch.long)
        return self.sample(h, anchor_ids, positions, seeds, temperatures)


__all__ = ["DSparkDrafter", "DSparkDrafts", "DSparkError", "load_dspark_weights", "draft_noise", "draft_config",
           "find_heads", "DRAFT_SALT", "KERNEL_OPS"]
