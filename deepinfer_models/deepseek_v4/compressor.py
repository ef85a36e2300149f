"""DeepSeek-V4 KV compressor (CSA ratio 4 with overlap, HCA ratio 128), paged.

Per token t at position p: ``kv_t = wkv x_t`` and ``z_t = wgate x_t + ape[p % r]``
(fp32). Entry w pools the window of tokens ``[w*r, (w+1)*r)`` by a per-channel
softmax over z; with overlap (CSA) each token projects two halves ``a | b`` and
entry w pools the ``a`` halves of window w-1 with the ``b`` halves of window w
(2r slots). The pooled vector is RMS-normed, rotated (compress rope) at ``w*r``
and written into the compressed cache when the window's last token is processed.

Cross-step state: the projected ``(kv, z)`` rows of the last ``c*r`` positions
(c = 2 with overlap, else 1) live in a per-request ring indexed by ``p % (c*r)``.
That is exactly what windows closing in later steps still need.
"""
from __future__ import annotations

import torch

from deepinfer_core.kv.spec import CompressedSpec, StateSpec
from deepinfer_core.runner.context import StepContext
from deepinfer_models.layers.decode_shortcuts import decode_shortcuts
from deepinfer_models.layers.static_index import closes_any, compact, take_rows, write_rows
from deepinfer_models.layers.linear import float_projection


class Compressor:
    """One compressor (main: d_c = head_dim, indexer: d_c = index_head_dim)."""

    def __init__(self, prefix: str, weights: dict[str, torch.Tensor], ratio: int, d_c: int, overlap: bool,
                 inv_freq: torch.Tensor, eps: float, kernels: dict, cache_name: str, block_size: int,
                 cache_dtype: torch.dtype):
        self.ratio, self.d_c, self.overlap = ratio, d_c, overlap
        self.c = 2 if overlap else 1
        self.wkv = float_projection(weights[f"{prefix}.wkv.weight"])  # [c*d_c, D] (fp32 products: gemm.dense_wide)
        self.wgate = float_projection(weights[f"{prefix}.wgate.weight"])  # [c*d_c, D]
        self.ape = weights[f"{prefix}.ape"].float()  # [r, c*d_c]
        self.norm_w = weights[f"{prefix}.norm.weight"].float()
        self.inv_freq, self.eps = inv_freq, eps
        self.k = kernels
        self.cache_name = cache_name
        self.state_name = cache_name + "_state"
        self.ring = self.c * ratio
        self.width = self.c * d_c
        self.cache_spec = CompressedSpec(entry_shape=(d_c,), dtype=cache_dtype, ratio=ratio,
                                         block_size=max(block_size, ratio))
        # ring rows hold kv | score, fp32
        self.state_spec = StateSpec(entry_shape=(self.ring, 2 * self.width), dtype=torch.float32)

    def specs(self) -> dict:
        return {self.cache_name: self.cache_spec, self.state_name: self.state_spec}

    def __call__(self, x: torch.Tensor, ctx: StepContext) -> None:
        """Project x [T, D], emit the entries of windows closing in this step into the cache.

        All requests at once: every slot of a closing window is gathered either from this
        step's projections (position inside the request's chunk) or from the request's ring
        (an earlier position), then pooled, normed, rotated and written.
        """
        pos = ctx.positions
        t = x.shape[0]
        kv = self.k["gemm.dense_wide"](x, self.wkv)  # fp32, x widened in the kernel
        sc = self.k["gemm.dense_wide"](x, self.wgate) + self.ape[pos % self.ratio]
        cache = ctx.caches[self.cache_name]
        state = ctx.caches[self.state_name]  # [slots, ring, 2*width] fp32: kv | score
        meta = ctx.meta(self.cache_name)
        r, d, ring, width = self.ratio, self.d_c, self.ring, self.width
        seq, start = ctx.token_seq, ctx.extras["token_start"]
        first_row, slots = ctx.extras["seq_first_row"], ctx.state_slots
        # a decode step: token i is slice i's only token, so its state slot is ``token_slot[i]`` and it is its
        # slice's last row (layers/decode_shortcuts.py: no gathers by token_seq)
        token_slot = ctx.extras["token_slot"] if decode_shortcuts(ctx) else None
        rows_now = torch.cat([kv, sc], dim=-1)
        state_rows = state.view(-1, 2 * width)
        nseq = first_row.shape[0]
        # Windows closing in this step, without a host sync: a request's chunk of n tokens closes at
        # most n // r + 1 windows, so T // r + B rows (all T rows when that is not fewer: ``closing`` None, no
        # gathers) hold them; padding rows are computed and not written.
        closing_mask = (pos + 1) % r == 0
        n_close = min(t, t // r + nseq)
        if not closes_any(ctx, r):  # known on the host: nothing to pool in this (eager) step
            n_close = 0
        elif n_close == t:
            closing, valid = None, closing_mask
        else:
            closing, valid = compact(closing_mask, n_close)
        if n_close:
            pos_c = take_rows(pos, closing)
            w = pos_c // r
            cur = w[:, None] * r + torch.arange(r, device=x.device)[None, :]  # window w: [Nw, r]
            where = torch.cat([cur - r, cur], dim=1) if self.overlap else cur  # + a-halves of window w-1
            s0 = take_rows(start, closing)[:, None]
            # each slot from this step's rows or from the request's ring (row picks only: exact); at decode token i
            # is slice i, so the slice's first row and state slot need no gather
            if token_slot is not None and closing is None:
                first_c, slot_c = first_row, token_slot
            else:
                s_of = take_rows(seq, closing)
                first_c, slot_c = first_row[s_of], slots[s_of]
            now_row = (first_c[:, None] + where - s0).clamp(0, t - 1)
            ring_row = slot_c[:, None] * ring + where % ring
            got = torch.where((where >= s0)[..., None], rows_now[now_row], state_rows[ring_row])  # [Nw, S, 2*width]
            g_kv, g_sc = got[..., :width], got[..., width:]
            if self.overlap:
                g_kv = torch.cat([g_kv[:, :r, :d], g_kv[:, r:, d:]], dim=1)
                g_sc = torch.cat([g_sc[:, :r, :d], g_sc[:, r:, d:]], dim=1)
            g_sc = g_sc.masked_fill((where < 0)[..., None], float("-inf"))  # slots before position 0
            pooled = self.k["compress.softmax_pool"](g_kv.to(x.dtype), g_sc)
            entry = self.k["norm.rms_rope"](pooled, self.norm_w, self.eps, w * r, self.inv_freq)
            out = take_rows(meta.write_slots, closing)
            # -1: the entry is already in a shared prefix-cache block (write_rows never writes a negative slot)
            write_rows(cache, out, entry, valid)
        # keep the last `ring` positions of every request's chunk for windows closing later
        if token_slot is not None:  # every row is its slice's last: all of them
            write_rows(state_rows, token_slot * ring + pos % ring, rows_now, None)
            return
        keep_mask = pos >= ctx.extras["seq_end"][seq] - ring
        n_keep = min(t, nseq * ring)
        if n_keep == t:
            keep, valid = None, keep_mask
        else:
            keep, valid = compact(keep_mask, n_keep)
        write_rows(state_rows, slots[take_rows(seq, keep)] * ring + take_rows(pos, keep) % ring,
                   take_rows(rows_now, keep), valid)
