"""Delayed mHC over a stack of V4.1 decoder layers (MODEL_SPEC.md 3.8).

With ``hc_pre_from_prev_sublayer`` the mixes ``(pre, post, comb)`` of a sublayer are still
computed from the current stream, but the stream is collapsed into the sublayer's input with
the ``pre`` of the *previous* sublayer; layer 0's attention input is stream 0. After the last
FFN the stream is finished with that FFN's ``post``/``comb`` and collapsed with its ``pre``
(there is no learned ``hc_head``). An Engram layer injects into the stream after the previous
FFN's update and before its own attention mix.

The driver only orders the calls; the numerics are the registry's ``mhc.*`` ops.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass
class HCLayer:
    """One decoder layer as the driver sees it.

    ``hc_attn`` / ``hc_ffn``: ``(fn, base, scale)``; ``attn_norm`` / ``ffn_norm``: the sublayers' input RMSNorm
    weights [D] (the driver applies them, fused with the mix); ``attn`` / ``ffn``: normed input [T, D] -> sublayer
    output [T, D], or a tuple of [T, D] parts that ``mhc.expand`` sums (the MoE's routed and shared outputs); ``inject``: optional ``R [T, n, D] -> R`` (Engram) run before the attention mix.
    """

    hc_attn: tuple
    hc_ffn: tuple
    attn_norm: torch.Tensor
    ffn_norm: torch.Tensor
    attn: Callable[[torch.Tensor], torch.Tensor]
    ffn: Callable[[torch.Tensor], torch.Tensor | tuple]
    inject: Callable[[torch.Tensor], torch.Tensor] | None = None


def run_delayed_mhc(residual: torch.Tensor, layers: list[HCLayer], kernels: dict, norm_eps: float, hc_eps: float,
                    sinkhorn_iters: int, cut: tuple[int, Callable[[torch.Tensor], torch.Tensor | None]] | None = None
                    ) -> torch.Tensor:
    """residual [T, n, D] (the embedding broadcast to n streams) -> collapsed final stream [T, D].

    The caller applies the final ``norm``. A sublayer boundary is one fused op (``mhc.expand_pre_norm``: the
    previous sublayer's expand, this one's mix, the collapse with the previous ``pre`` and the input norm);
    an Engram layer expands first, injects, then runs ``mhc.pre_norm``. ``cut = (c, keep)``: decoder-side
    replay (MODEL_SPEC.md 6.2). At layer ``c``, ``keep(h)`` gets the normed attention input ``h [T, D]`` of
    every row (it writes their KV) and returns the rows to keep (int64 [K]) or None; from there on the stream
    holds only those rows (mixes are per row, so kept rows are computed as before) and the result is
    scattered back to [T, D], trimmed rows zero (nothing reads them).
    """
    k = kernels
    if not layers:
        raise ValueError("run_delayed_mhc needs at least one layer")
    args = (norm_eps, hc_eps, sinkhorn_iters)
    num_rows = residual.shape[0]
    kept = None
    pre_prev = None
    pending = None  # (y, post, comb) of the previous FFN, not yet expanded into the stream
    for i, layer in enumerate(layers):
        if layer.inject is not None:
            if pending is not None:
                residual, pending = k["mhc.expand"](residual, *pending), None
            residual = layer.inject(residual)
        if pre_prev is None:  # layer 0: the attention input is stream 0
            pre_a, post_a, comb_a = k["mhc.mix"](residual, *layer.hc_attn, *args)
            h = k["norm.rms"](residual[:, 0], layer.attn_norm, norm_eps)
        elif pending is None:
            h, pre_a, post_a, comb_a = k["mhc.pre_norm"](residual, *layer.hc_attn, layer.attn_norm, *args, pre_prev)
        else:
            residual, h, pre_a, post_a, comb_a = k["mhc.expand_pre_norm"](residual, *pending, *layer.hc_attn,
                                                                          layer.attn_norm, *args, pre_prev)
        if cut is not None and i == cut[0]:
            kept = cut[1](h)
            if kept is not None:
                residual, h, pre_a, post_a, comb_a = (v.index_select(0, kept)
                                                      for v in (residual, h, pre_a, post_a, comb_a))
        residual, h, pre_f, post_f, comb_f = k["mhc.expand_pre_norm"](residual, layer.attn(h), post_a, comb_a,
                                                                      *layer.hc_ffn, layer.ffn_norm, *args, pre_a)
        pending = (layer.ffn(h), post_f, comb_f)
        pre_prev = pre_f
    residual = k["mhc.expand"](residual, *pending)
    out = k["mhc.collapse"](residual, pre_prev)
    if kept is None:
        return out
    return out.new_zeros((num_rows, *out.shape[1:])).index_copy_(0, kept, out)
