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

    ``hc_attn`` / ``hc_ffn``: ``(fn, base, scale)``; ``attn`` / ``ffn``: collapsed stream [T, D]
    -> sublayer output [T, D] (each applies its own input norm); ``inject``: optional
    ``R [T, n, D] -> R`` (Engram) run before the attention mix.
    """

    hc_attn: tuple
    hc_ffn: tuple
    attn: Callable[[torch.Tensor], torch.Tensor]
    ffn: Callable[[torch.Tensor], torch.Tensor]
    inject: Callable[[torch.Tensor], torch.Tensor] | None = None


def run_delayed_mhc(residual: torch.Tensor, layers: list[HCLayer], kernels: dict, norm_eps: float, hc_eps: float,
                    sinkhorn_iters: int, cut: tuple[int, Callable[[torch.Tensor], torch.Tensor | None]] | None = None
                    ) -> torch.Tensor:
    """residual [T, n, D] (the embedding broadcast to n streams) -> collapsed final stream [T, D].

    The caller applies the final ``norm``. ``cut = (c, keep)``: decoder-side replay (MODEL_SPEC.md
    6.2). At layer ``c``, ``keep(x)`` gets the collapsed attention input ``x [T, D]`` of every row
    (it writes their KV) and returns the rows to keep (int64 [K]) or None; from there on the stream
    holds only those rows (mixes are per row, so kept rows are computed as before) and the result is
    scattered back to [T, D], trimmed rows zero (nothing reads them).
    """
    mix, collapse, expand = kernels["mhc.mix"], kernels["mhc.collapse"], kernels["mhc.expand"]
    if not layers:
        raise ValueError("run_delayed_mhc needs at least one layer")
    num_rows = residual.shape[0]
    kept = None
    pre_prev = None
    y_f = post_f = comb_f = None
    for i, layer in enumerate(layers):
        if y_f is not None:  # finish the previous layer's FFN update
            residual = expand(residual, y_f, post_f, comb_f)
        if layer.inject is not None:
            residual = layer.inject(residual)
        x = residual[:, 0] if pre_prev is None else collapse(residual, pre_prev)
        if cut is not None and i == cut[0]:
            kept = cut[1](x)
            if kept is not None:
                residual, x = residual.index_select(0, kept), x.index_select(0, kept)
                pre_prev = None if pre_prev is None else pre_prev.index_select(0, kept)
        pre_a, post_a, comb_a = mix(residual, *layer.hc_attn, norm_eps, hc_eps, sinkhorn_iters)
        residual = expand(residual, layer.attn(x), post_a, comb_a)
        pre_f, post_f, comb_f = mix(residual, *layer.hc_ffn, norm_eps, hc_eps, sinkhorn_iters)
        y_f = layer.ffn(collapse(residual, pre_a))
        pre_prev = pre_f
    residual = expand(residual, y_f, post_f, comb_f)
    out = collapse(residual, pre_prev)
    if kept is None:
        return out
    return out.new_zeros((num_rows, *out.shape[1:])).index_copy_(0, kept, out)
