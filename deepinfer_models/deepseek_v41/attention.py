"""DeepSeek-V4.1 attention (MODEL_SPEC.md 3.7): V4's shared-KV MQA with sinks and grouped
output projection, minus the per-head q norm, over the layer's own sliding window plus, on
compressed layers, the entries of ``kv_src(L)``'s compressed cache at the top-k positions
published by ``idx_src(L)``.

Layer roles decide what a layer owns: every layer has its SWA cache; a kv source owns the
compressor and the compressed cache (and the index keys if it is also an index source);
an index source owns an indexer. Consumers own no compressed state at all.
"""
from __future__ import annotations

import os

import torch

from deepinfer_core.kv.spec import KVCacheSpec
from deepinfer_core.runner.context import StepContext
from deepinfer_models.deepseek_v4.attention import SharedKVAttention
from deepinfer_models.deepseek_v41.compressor import CompressorV41, cache_name
from deepinfer_models.deepseek_v41.config import DeepseekV41Config
from deepinfer_models.deepseek_v41.indexer import IndexerV41
from deepinfer_models.deepseek_v41.step import IndexShare, StepRows
from deepinfer_models.layers.linear import LinearGroup
from deepinfer_models.layers.static_index import write_rows

# A kv source's KV half (its SWA row, the compressor, the index keys) as a ``stream.side`` branch beside the query
# half's norm and ``wq_b`` GEMV, joined before the first cache read (the indexer, the attention). On by default
# (``DEEPINFER_BRANCH_KV_WRITE=0`` runs it in order): predicted -20 to -30 us a V4.1 batch-1 step (thirty-third pass);
# measured -10 to -20 us pipelined (2.49 -> 2.47, 2.48 -> 2.47 ms), with tiny V4 / V4.1 greedy logits
# bit-equal on and off (docs/performance.md, thirty-fourth pass). ``tests/models/test_side_branch_order.py`` runs
# it with the branch deferred to its join.
BRANCH_KV_WRITE = os.environ.get("DEEPINFER_BRANCH_KV_WRITE", "1") == "1"
# The other layers' KV half too (their SWA row only: the KV RMSNorm, the rotation and the ring write, ~6 us of the
# chain a layer at batch 1 on an H100, pass43c) as a branch beside the query half, where ``BRANCH_KV_WRITE`` is on.
# 41 of V4.1-Flash's 43 layers (6 of the 8-layer slice's) are not kv sources. On since the forty-fourth pass (H100,
# alternated twice: batch 1 2.135 -> 2.105 ms pipelined, -30 us; with ``BRANCH_COMPRESSOR`` -45 us;
# docs/performance_pass_44.md); ``DEEPINFER_BRANCH_SWA_WRITE=0``: in order.
BRANCH_SWA_WRITE = os.environ.get("DEEPINFER_BRANCH_SWA_WRITE", "1") == "1"
# A kv source's compressor (its fp32 ``wkv`` / ``wgate`` GEMV reads only x, then the pooling, the entry's norm and
# rotation, the index keys and the cache writes) as its own branch forked at the attention's start, beside the
# ``wq_a`` / ``wkv`` GEMV, instead of inside the KV branch forked after it, where ``BRANCH_KV_WRITE`` is on. In the
# forty-third pass's timeline (pass43c, H100, batch 1) the KV branch outlasts the query half by 41 us at the ratio-2
# source and 17 us at the ratio-1 source, so the attention waits on it. On since the forty-fourth pass (H100,
# alternated twice: batch 1 -30 us, batch 32 -75 us; both branches -45 / -95 us; docs/performance_pass_44.md);
# ``DEEPINFER_BRANCH_COMPRESSOR=0``: inside the KV branch.
BRANCH_COMPRESSOR = os.environ.get("DEEPINFER_BRANCH_COMPRESSOR", "1") == "1"
# An index source's head weights ``weights_proj(x)`` (they read only x) as a ``stream.side`` branch forked at the
# attention's start, joined by the indexer: one dense GEMV a layer off the chain from wq_b to the scores.
# ``DEEPINFER_BRANCH_INDEX_WEIGHTS=0``: in order, inside the indexer (docs/performance.md, thirty-sixth pass).
BRANCH_INDEX_WEIGHTS = os.environ.get("DEEPINFER_BRANCH_INDEX_WEIGHTS", "1") == "1"


class AttentionV41(SharedKVAttention):
    def __init__(self, cfg: DeepseekV41Config, layer: int, w: dict, make_linear, rope: dict, kernels: dict,
                 block_size: int, cache_dtype: torch.dtype, merge_projections: bool | None = None):
        super().__init__(cfg, layer, w, make_linear, rope, kernels, block_size, cache_dtype, merge_projections)
        self.compressor = None
        if cfg.is_kv_source(layer):
            self.compressor = CompressorV41(cfg, layer, w, make_linear, self.inv_freq, kernels, block_size, cache_dtype,
                                            self.merge)
        self.indexer = None
        if cfg.is_index_source(layer):
            self.indexer = IndexerV41(cfg, layer, make_linear, self.inv_freq, kernels)
        # wq_b with the indexer's wq_b (both read qr) on index layers; wq_b alone elsewhere
        self.q_b = LinearGroup([self.wq_b] + ([self.indexer.wq_b] if self.indexer is not None else []), self.merge)
        self.cmp_name = cache_name(cfg.kv_src(layer)) if self.ratio else None
        self.topk_from = cfg.idx_src(layer) if self.ratio else None

    def specs(self) -> dict[str, KVCacheSpec]:
        out: dict[str, KVCacheSpec] = {self.swa_name: self.swa_spec}
        if self.compressor is not None:
            out.update(self.compressor.specs)
        return out

    def __call__(self, x: torch.Tensor, ctx: StepContext, rows: StepRows | None, share: IndexShare) -> torch.Tensor:
        """x [T, D] (normed attention input) -> [T, D]. ``rows`` is only read by a kv source's compressor."""
        side, head_w, branches = self.k["stream.side"], None, []
        if self.indexer is not None and BRANCH_INDEX_WEIGHTS:
            head_w = side(self.indexer.weights_proj, x)
        compress = self.compressor is not None
        if compress and BRANCH_KV_WRITE and BRANCH_COMPRESSOR:  # it reads only x: forked before wq_a / wkv
            branches.append(side(self.compressor, x, ctx, rows))
            compress = False
        q_a, kv_a = self.qkv_a(x)  # one product where merged
        if BRANCH_KV_WRITE and (self.compressor is not None or BRANCH_SWA_WRITE):
            branches.append(side(self.write_kv, x, ctx, rows, kv_a, compress))
            return self.attend(x, ctx, share, q_a, branches, head_w)
        self.write_kv(x, ctx, rows, kv_a)
        return self.attend(x, ctx, share, q_a, None, head_w)

    def write_kv(self, x: torch.Tensor, ctx: StepContext, rows: StepRows | None,
                 kv_a: torch.Tensor | None = None, compress: bool = True) -> None:
        """The KV half (vLLM's ``forward_kv``): SWA KV of every row, and on a kv source (unless ``compress`` is
        False: the caller runs the compressor apart) the compressed entries and index keys. Decoder-side replay
        runs it on all rows of the cut layer, then ``attend`` on the kept rows only. ``kv_a``: ``wkv(x)`` when the
        caller has it."""
        k, pos = self.k, ctx.positions
        kv_a = self.wkv(x) if kv_a is None else kv_a
        kv = k["norm.rms_rope"](kv_a, self.kv_norm, self.eps, pos, self.inv_freq)
        write_rows(ctx.caches[self.swa_name], ctx.meta(self.swa_name).write_slots, kv)  # -1: not written
        if compress and self.compressor is not None:
            self.compressor(x, ctx, rows)

    def attend(self, x: torch.Tensor, ctx: StepContext, share: IndexShare,
               q_a: torch.Tensor | None = None, kv_written=None, head_w=None) -> torch.Tensor:
        """The query half: x [T, D] -> [T, D], reading the caches ``write_kv`` filled. ``q_a``: ``wq_a(x)`` when
        the caller has it. ``kv_written``: the ``stream.side`` branches writing the caches (``write_kv``, and the
        compressor where it runs apart), joined before the first cache read. ``head_w``: the branch computing the
        indexer's ``weights_proj(x)``, joined by the indexer."""
        k = self.k
        t, pos = x.shape[0], ctx.positions
        qr = k["norm.rms"](self.wq_a(x) if q_a is None else q_a, self.q_norm, self.eps)
        q, *q_index = self.q_b(qr)
        q = q.view(t, self.h, self.d)
        if self.cfg.q_head_norm:  # V4 behaviour; V4.1-Flash has it off ("qr is normed before wq_b")
            q = k["norm.rms_unweighted"](q, self.eps)
        for branch in kv_written or ():  # the caches below (index keys, SWA, compressed) are read from here on
            branch.join()
        swa, swa_meta = ctx.caches[self.swa_name], ctx.meta(self.swa_name)
        if self.indexer is not None:
            share.topk[self.layer] = self.indexer(x, qr, ctx, share, q_index[0],
                                                  head_w.join() if head_w is not None else None)
        cmp_cache, cmp_idx = None, None
        if self.ratio:
            cmp_cache = ctx.caches[self.cmp_name]
            visible = ctx.meta(self.cmp_name).read_idx  # [T, N] entry slots in position order
            sel = share.topk[self.topk_from]  # positions, -1 padded
            cmp_idx = share.entry_slots(visible, sel, k["index.entry_slots"])  # once per (kv, index) source pair
        # rope(q), the attention, the inverse rope of the output: one fused op
        o = k["attention.sparse_sink_rope"](q, swa, swa_meta.read_idx, cmp_cache, cmp_idx, self.sinks, self.d ** -0.5,
                                            pos, self.inv_freq)
        return self.wo_b(self.wo_a(o.reshape(t, -1)))
