"""DeepSeek-V4.1 indexer of an index-source layer (MODEL_SPEC.md 3.5, 3.6).

Queries ``q = wq_b(qr)`` ([Hi, Di], RoPE tail at the token position with the layer's rope)
score the index keys of the layer's kv source (``kv_src(L)``, which owns them) with head
weights ``weights_proj(x) * Di^-1/2 * Hi^-1/2``: ``I(p, g) = sum_h w_h relu(q_h . k_g)`` over the
visible entries ``g < (p+1)//r``. The top ``index_topk`` positions are published for the
compressed layers up to the next index source.

Two-level candidate filter: the candidate source also publishes, per token, its best
``candidate_topk_blocks`` blocks of ``candidate_block_size`` positions (newest block always
kept); every later index source masks its scores to those blocks before its own top-k.
The mask is applied whatever the context length (spec semantics; vLLM's "select all when
short" shortcut gives the same result whenever ``index_topk <= topk_blocks * block_size``).
"""
from __future__ import annotations

import torch

from deepinfer_core.runner.context import StepContext
from deepinfer_models.deepseek_v41.compressor import keys_cache_name
from deepinfer_models.deepseek_v41.config import DeepseekV41Config
from deepinfer_models.deepseek_v41.step import IndexShare


class IndexerV41:
    def __init__(self, cfg: DeepseekV41Config, layer: int, make_linear, inv_freq: torch.Tensor, kernels: dict):
        p = f"layers.{layer}.attn.indexer"
        self.cfg, self.k, self.layer = cfg, kernels, layer
        self.ratio = cfg.ratio(layer)
        self.n_heads, self.head_dim = cfg.index_n_heads, cfg.index_head_dim
        self.wq_b = make_linear(f"{p}.wq_b")
        self.weights_proj = make_linear(f"{p}.weights_proj")
        self.inv_freq = inv_freq
        self.keys_name = keys_cache_name(cfg.kv_src(layer))
        self.publishes_candidates = cfg.is_candidate_source(layer)
        self.uses_candidates = cfg.is_candidate_consumer(layer)
        self.weight_scale = self.head_dim ** -0.5 * self.n_heads ** -0.5

    def __call__(self, x: torch.Tensor, qr: torch.Tensor, ctx: StepContext, share: IndexShare,
                 q_b: torch.Tensor | None = None, weights: torch.Tensor | None = None) -> torch.Tensor:
        """x [T, D] attention input, qr [T, q_lora] -> top-k compressed positions [T, k] int64, -1 padded.
        ``q_b``: ``wq_b(qr)`` [T, Hi * Di] when the caller has it (the attention's merged product); ``weights``:
        ``weights_proj(x)`` [T, Hi] when the caller has it (a branch forked where x was ready)."""
        t = x.shape[0]
        pos = ctx.positions
        q = (self.wq_b(qr) if q_b is None else q_b).view(t, self.n_heads, self.head_dim)
        q = self.k["rope.interleaved"](q, pos, self.inv_freq)
        if weights is None:  # [T, Hi] in x's dtype; its scale rides in score_scale (no launches here)
            weights = self.weights_proj(x)
        visible = ctx.meta(self.keys_name).read_idx  # [T, N] key slots in position order, -1 = not visible
        scores = self.k["index.scores"](q, weights, ctx.caches[self.keys_name], visible, self.weight_scale)
        cfg = self.cfg
        if self.publishes_candidates:
            num_visible = pos + 1 if self.ratio == 1 else (pos + 1) // self.ratio  # one launch at ratio 1
            share.candidates = self.k["index.candidate_blocks"](scores, num_visible, cfg.candidate_block_size,
                                                                cfg.candidate_topk_blocks)
        if self.uses_candidates:
            scores = self.k["index.candidate_mask"](scores, share.candidates, cfg.candidate_block_size)
        return self.k["index.topk"](scores, cfg.index_topk)
