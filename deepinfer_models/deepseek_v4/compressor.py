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


class Compressor:
    """One compressor (main: d_c = head_dim, indexer: d_c = index_head_dim)."""

    def __init__(self, prefix: str, weights: dict[str, torch.Tensor], ratio: int, d_c: int, overlap: bool,
                 inv_freq: torch.Tensor, eps: float, kernels: dict, cache_name: str, block_size: int,
                 cache_dtype: torch.dtype):
        self.ratio, self.d_c, self.overlap = ratio, d_c, overlap
        self.c = 2 if overlap else 1
        self.wkv = weights[f"{prefix}.wkv.weight"].float()  # [c*d_c, D]
        self.wgate = weights[f"{prefix}.wgate.weight"].float()  # [c*d_c, D]
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
        """Project x [T, D], emit the entries of windows closing in this step into the cache."""
        pos = ctx.positions
        xf = x.float()
        kv = self.k["gemm.dense"](xf, self.wkv)
        sc = self.k["gemm.dense"](xf, self.wgate) + self.ape[pos % self.ratio]
        cache = ctx.caches[self.cache_name]
        state = ctx.caches[self.state_name]
        meta = ctx.meta(self.cache_name)
        r, d, ring = self.ratio, self.d_c, self.ring
        row0 = 0
        for i, s in enumerate(ctx.slices):
            rows = slice(row0, row0 + s.num_tokens)
            row0 += s.num_tokens
            s0, e = s.start_pos, s.start_pos + s.num_tokens
            slot = s.state_slot
            h0 = max(0, s0 - ring)
            hist_pos = torch.arange(h0, s0, device=x.device)
            hist = state[slot, hist_pos % ring] if s0 > h0 else state.new_zeros(0, 2 * self.width)
            ext_kv = torch.cat([hist[:, : self.width], kv[rows]], dim=0)
            ext_sc = torch.cat([hist[:, self.width:], sc[rows]], dim=0)
            closing = [p for p in range(s0, e) if (p + 1) % r == 0]
            if closing:
                w = torch.tensor([p // r for p in closing], device=x.device)
                # positions of the b-half (or whole) slots: window w; a-half: window w-1
                cur = w[:, None] * r + torch.arange(r, device=x.device)[None, :]  # [Nw, r]
                if self.overlap:
                    prev = cur - r
                    ok_prev = prev >= 0
                    pk = ext_kv[(prev - h0).clamp(min=0)][..., :d]
                    ps = ext_sc[(prev - h0).clamp(min=0)][..., :d].masked_fill(~ok_prev[..., None], float("-inf"))
                    ck = ext_kv[cur - h0][..., d:]
                    cs = ext_sc[cur - h0][..., d:]
                    pool_kv, pool_sc = torch.cat([pk, ck], dim=1), torch.cat([ps, cs], dim=1)
                else:
                    pool_kv, pool_sc = ext_kv[cur - h0], ext_sc[cur - h0]
                pooled = self.k["compress.softmax_pool"](pool_kv.to(x.dtype), pool_sc)
                normed = self.k["norm.rms"](pooled, self.norm_w, self.eps)
                entry = self.k["rope.interleaved"](normed, w * r, self.inv_freq)
                tok_rows = torch.tensor([rows.start + (p - s0) for p in closing], device=x.device)
                slots = meta.write_slots[tok_rows]
                keep = slots >= 0  # -1: the entry is already in a shared prefix-cache block
                cache[slots[keep]] = entry[keep].to(cache.dtype)
            # keep the last `ring` positions' projections for windows closing later
            keep = torch.arange(max(s0, e - ring), e, device=x.device)
            if keep.numel():
                state[slot, keep % ring] = torch.cat([kv[rows][keep - s0], sc[rows][keep - s0]], dim=-1)
