"""DeepSeek-V4.1 KV compressor of a kv-source layer (ratio 1 or 2), paged (MODEL_SPEC.md 3.3).

Per token t (attention input x_t, after ``attn_norm``): ``kv_t = wkv x_t`` and, for ratio 2,
``z_t = wgate x_t``, both fp32. Entry g covers tokens ``[g*r, (g+1)*r)`` and is emitted when
its last token is processed:

- ratio 1: ``u_g = kv_g`` (one entry per token, no gate);
- ratio 2: ``u_g = a * kv_2g + (1-a) * kv_2g+1`` with the per-channel 2-way softmax
  ``a = softmax(z_2g, z_2g+1)[0]`` (no position bias, no overlap, unlike V4).

``latent_g = norm(u_g)`` (fp32 RMSNorm, then the activation dtype). The compressed KV entry
is ``latent_g`` rotated on its RoPE tail at position ``g*r`` (compress rope); if the layer is
also an index source it writes the index key ``rope_{g*r}(k_norm(wk latent_g))`` too: index
keys come from the *pre-RoPE* latent (MODEL_SPEC.md 3.5).

Cross-step state (ratio 2 only): the pair ``(2g, 2g+1)`` may straddle two steps, so the
projected ``kv | z`` rows of each request's last two positions live in a per-request
``StateSpec`` ring indexed by ``p % RING``. Ratio 1 needs no state.
"""
from __future__ import annotations

import os

import torch

from deepinfer_core.kv.spec import CompressedSpec, StateSpec
from deepinfer_core.runner.context import StepContext
from deepinfer_models.deepseek_v41.config import DeepseekV41Config
from deepinfer_models.deepseek_v41.step import StepRows
from deepinfer_models.layers.static_index import closes_any, compact, take_rows, write_rows
from deepinfer_models.layers.linear import float_projection

# A decode step's ratio-2 pooling as one op (``compress.ring_pair_pool``: the closing mask, the partner's ring row,
# the pool and the token's ring write) instead of ~10 launches of index math and glue around ``compress.softmax_pool``
# (pass44b, H100: the ratio-2 source's branch outlasts the query half by 31 us, ~30 us of it these launches run
# slowly beside the wq_b GEMV). The same bits where a platform composes the op from its parts. On since the
# forty-fifth pass (H100, six readings an arm: batch 1 -20 us, batch 32 even; docs/performance_pass_45.md);
# ``DEEPINFER_COMPRESS_RING_POOL=0``: the general path.
RING_PAIR_POOL = os.environ.get("DEEPINFER_COMPRESS_RING_POOL", "1") == "1"
# Positions kept per request for ratio 2. Two would do for plain decoding; 8 (vLLM's
# ``max(8, next_pow2(num_spec_tokens + 2))``) lets up to 6 rejected speculative positions be
# written without overwriting a row a later pair still needs (rows are indexed by position).
RING = 8


def compressed_block_size(block_size: int, ratio: int) -> int:
    """Token block size of a compressed group: the engine's block size rounded up to a multiple of the ratio."""
    return -(-block_size // ratio) * ratio


class CompressorV41:
    """Compressor of kv-source ``layer``; owns the layer's compressed cache (and index-key cache)."""

    def __init__(self, cfg: DeepseekV41Config, layer: int, w: dict, make_linear, inv_freq: torch.Tensor,
                 kernels: dict, block_size: int, cache_dtype: torch.dtype, merge: bool = False):
        """``merge``: at ratio 2, wkv and wgate (both read x) stacked into one fp32 product, whose output is the
        ring's ``kv | z`` row as it is (``layers.linear.MERGE_PROJECTIONS``)."""
        p = f"layers.{layer}.attn"
        self.k, self.eps = kernels, cfg.rms_norm_eps
        self.ratio = cfg.ratio(layer)
        self.d = cfg.head_dim
        self.inv_freq = inv_freq
        # Projections in fp32 (bf16 weights, fp32 outputs: MODEL_SPEC.md 3.3 step 1): the weights widened at load,
        # or as stored and widened by ``gemm.dense_wide`` (``float_projection``)
        self.wkv = float_projection(w[f"{p}.compressor.wkv.weight"])
        self.wgate = float_projection(w[f"{p}.compressor.wgate.weight"]) if self.ratio == 2 else None
        self.w_both = None  # [2d, D]: wkv's rows, then wgate's
        if merge and self.wgate is not None:
            self.w_both = torch.cat([self.wkv, self.wgate])
            self.wkv, self.wgate = self.w_both[: self.wkv.shape[0]], self.w_both[self.wkv.shape[0]:]
        self.norm_w = w[f"{p}.compressor.norm.weight"].float()
        bs = compressed_block_size(block_size, self.ratio)
        self.cache_name = cache_name(layer)
        self.specs = {self.cache_name: CompressedSpec(entry_shape=(self.d,), dtype=cache_dtype, ratio=self.ratio,
                                                      block_size=bs)}
        self.ring_name = None
        if self.ratio == 2:
            self.ring_name = f"{p}.cmp_ring"  # rows hold kv | z, fp32
            self.specs[self.ring_name] = StateSpec(entry_shape=(RING, 2 * self.d), dtype=torch.float32)
        self.keys_name = None
        if cfg.owns_index_keys(layer):
            self.wk = make_linear(f"{p}.indexer.wk")
            self.k_norm = w[f"{p}.indexer.k_norm.weight"].float()
            self.keys_name = keys_cache_name(layer)
            self.specs[self.keys_name] = CompressedSpec(entry_shape=(cfg.index_head_dim,), dtype=cache_dtype,
                                                        ratio=self.ratio, block_size=bs)

    def __call__(self, x: torch.Tensor, ctx: StepContext, rows: StepRows) -> None:
        """Project x [T, D]; write the entries (and index keys) of groups closing in this step."""
        pos = ctx.positions
        t = pos.shape[0]
        # closing: the rows whose group closes, or None for every row (ratio 1, and every decode step at ratio 2:
        # a static selection of all rows, so no index launches; the graphed step runs a few dozen fewer)
        if self.ratio == 1:  # every token closes its group
            closing, valid = None, None
            u = self.k["gemm.dense_wide"](x, self.wkv)  # [T, d] fp32 (x widened in the kernel)
        else:
            both = self._kv_gate(x)  # [T, 2d] fp32: kv | z
            # a slice of n tokens closes at most n // 2 + 1 pairs: a static bound, no host sync;
            # padding rows are computed and not written
            n_close = min(t, t // self.ratio + rows.last.shape[0])
            if not closes_any(ctx, self.ratio):  # known on the host: only the ring is updated (eager step)
                self._store_tail(both, ctx, rows)
                return
        if self.ratio == 2 and rows.decode and RING_PAIR_POOL:  # one op: mask, partner, pool, ring write
            closing = None
            u, valid, _ = self.k["compress.ring_pair_pool"](both, ctx.caches[self.ring_name], rows.slot, pos)
        elif self.ratio != 1:
            mask = pos % self.ratio == self.ratio - 1  # (p + 1) % r == 0 for p >= 0: two launches, not three
            if n_close == t:
                closing, valid = None, mask
            else:
                closing, valid = compact(mask, n_close)
            u = self._pool_pairs(both, closing, ctx, rows)
        # the entries: latent = norm(u) in x's dtype [G, d], rotated at the group starts ``at`` [G] and stored
        latent, at, _ = self.k["compress.entry_write"](
            u, self.norm_w, self.eps, take_rows(pos, closing), self.inv_freq, ctx.caches[self.cache_name],
            take_rows(ctx.meta(self.cache_name).write_slots, closing), valid, ratio=self.ratio, dtype=x.dtype)
        if self.keys_name is not None:
            key = self.k["norm.rms_rope"](self.wk(latent), self.k_norm, self.eps, at, self.inv_freq)
            _write(ctx.caches[self.keys_name], take_rows(ctx.meta(self.keys_name).write_slots, closing), key, valid)

    def _kv_gate(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, D] -> ``kv | z`` [T, 2d] fp32 (x widened): one product over the stacked weights, or two and a
        concat."""
        dense = self.k["gemm.dense_wide"]
        if self.w_both is not None:
            return dense(x, self.w_both)
        return torch.cat([dense(x, self.wkv), dense(x, self.wgate)], dim=-1)

    def _pool_pairs(self, both: torch.Tensor, closing: torch.Tensor | None, ctx: StepContext,
                    rows: StepRows) -> torch.Tensor:
        """Pooled ``u`` [G, d] of the pairs closed by the ``closing`` rows (odd positions; None: every row, G = T);
        ``both`` [T, 2d] is every row's ``kv | z``."""
        ring = ctx.caches[self.ring_name]  # [slots, RING, 2d]
        prev = take_rows(ctx.positions, closing) - 1
        from_ring = ring[take_rows(rows.slot, closing), prev % RING]
        if rows.decode:  # a decode step starts every slice at its token: the partner is always in the ring
            partner = from_ring
        else:  # the partner (even position) is in this step unless the step started at the closing token
            here = (prev >= take_rows(rows.start, closing))[:, None]
            before = torch.cat([both[:1], both[:-1]]) if closing is None else both[(closing - 1).clamp(min=0)]
            partner = torch.where(here, before, from_ring)
        pair = torch.stack([partner, take_rows(both, closing)], dim=1)  # [G, 2, 2d]: kv | z of the pair's positions
        u = self.k["compress.softmax_pool"](pair[..., : self.d], pair[..., self.d:])
        # keep the last two positions of every request for pairs closing in a later step
        # (read above, written after: a 1-token step reads slot (p-1)%2 and writes p%2)
        self._store_tail(both, ctx, rows)
        return u

    def _store_tail(self, both: torch.Tensor, ctx: StepContext, rows: StepRows) -> None:
        ring = ctx.caches[self.ring_name]  # [slots, RING, 2d]
        keep, dest, valid = rows.ring_tail(ctx, RING)
        write_rows(ring.view(-1, ring.shape[-1]), dest, take_rows(both, keep), valid)


def _write(cache: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor, valid: torch.Tensor | None = None) -> None:
    """Store rows at their slots; slot -1 = not written (the entry lives in a shared prefix-cache block),
    nor is a row with ``valid`` False (padding of a static-size selection). No host sync."""
    # the op never writes a negative slot (in the kernel on a GPU: no launch of its own here)
    write_rows(cache, slots, rows, valid)


def cache_name(layer: int) -> str:
    """Compressed-KV cache of kv-source ``layer``."""
    return f"layers.{layer}.attn.cmp"


def keys_cache_name(layer: int) -> str:
    """Index-key cache of ``layer`` (a kv source that is also an index source)."""
    return f"layers.{layer}.attn.index_keys"
