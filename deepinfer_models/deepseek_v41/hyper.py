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

import os
from dataclasses import dataclass
from typing import Callable

import torch

from deepinfer_core.kernels.ops.stream import Joined

# A sublayer's mix as a ``stream.side`` branch (``_Boundary``): on a second stream the mix's projection and gate
# (two launches of a batch-1 boundary's five) leave the chain from one sublayer to the next: V4.1 batch 1 -130 to
# -150 us pipelined on an H100. ``DEEPINFER_MHC_MIX_BRANCH=0``: the fused boundary ops in order (docs/performance.md,
# thirty-sixth pass).
MIX_BRANCH = os.environ.get("DEEPINFER_MHC_MIX_BRANCH", "1") == "1"


@dataclass
class HCLayer:
    """One decoder layer as the driver sees it.

    ``hc_attn`` / ``hc_ffn``: ``(fn, base, scale)``; ``attn_norm`` / ``ffn_norm``: the sublayers' input RMSNorm
    weights [D] (the driver applies them, fused with the mix); ``attn`` / ``ffn``: normed input [T, D] -> sublayer
    output [T, D], or a tuple of [T, D] parts that ``mhc.expand`` sums (the MoE's routed and shared outputs);
    ``inject``: optional ``R [T, n, D] -> R`` (Engram) run before the attention mix.
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

    The caller applies the final ``norm``. At a sublayer boundary the previous sublayer's output is expanded into
    the streams with its ``post``/``comb``, the sublayer's input is the streams collapsed with the previous ``pre``
    and normed, and this sublayer's mix ``(pre, post, comb)`` of the new streams is computed for the next boundary
    (``_Boundary``). An Engram layer expands first, injects, then enters its attention. ``cut = (c, keep)``:
    decoder-side replay (MODEL_SPEC.md 6.2). At layer ``c``, ``keep(h)`` gets the normed attention input
    ``h [T, D]`` of every row (it writes their KV) and returns the rows to keep (int64 [K]) or None; from there on
    the stream holds only those rows (mixes are per row, so kept rows are computed as before) and the result is
    scattered back to [T, D], trimmed rows zero (nothing reads them).
    """
    if not layers:
        raise ValueError("run_delayed_mhc needs at least one layer")
    b = _Boundary(kernels, norm_eps, hc_eps, sinkhorn_iters)
    num_rows = residual.shape[0]
    kept = None
    y_prev, mix_prev = None, None  # the previous FFN's output (not yet expanded) and its boundary's mix
    for i, layer in enumerate(layers):
        if layer.inject is not None:
            if y_prev is not None:
                residual, y_prev = b.expand(residual, y_prev, mix_prev), None
            residual = layer.inject(residual)
        if mix_prev is None:  # layer 0: the attention input is stream 0
            mix_a = b.mix(residual, layer.hc_attn)
            h = kernels["norm.rms"](residual[:, 0], layer.attn_norm, norm_eps)
        else:
            residual, h, mix_a = b(residual, y_prev, mix_prev, layer.hc_attn, layer.attn_norm)
        if cut is not None and i == cut[0]:
            kept = cut[1](h)
            if kept is not None:
                residual, h = residual.index_select(0, kept), h.index_select(0, kept)
                mix_a = Joined(tuple(v.index_select(0, kept) for v in mix_a.join()))
        residual, h, mix_prev = b(residual, layer.attn(h), mix_a, layer.hc_ffn, layer.ffn_norm)
        y_prev = layer.ffn(h)
    residual = b.expand(residual, y_prev, mix_prev)
    out = kernels["mhc.collapse"](residual, mix_prev.join()[0])
    if kept is None:
        return out
    return out.new_zeros((num_rows, *out.shape[1:])).index_copy_(0, kept, out)


class _Boundary:
    """The ops of a sublayer boundary. A mix is a branch (``join() -> (pre, post, comb)``, fp32).

    In the delayed mHC a sublayer's input is collapsed with the *previous* mix's ``pre``, so the new mix is read
    only one sublayer later: with ``MIX_BRANCH`` it runs as a ``stream.side`` branch (on a platform with a second
    stream, beside the sublayer's own launches; the reference runs it at once), and the sublayer's input needs
    only ``mhc.expand`` and ``mhc.collapse_norm`` (the collapse and the norm as one op). Without it the boundary
    is the fused ops ``mhc.expand_pre_norm`` / ``mhc.pre_norm`` in order. The reference gives the same bits
    either way; a platform's ``mhc.collapse_norm`` kernel may sum the norm's squares in another order than its
    ``norm.rms``.
    """

    def __init__(self, kernels: dict, norm_eps: float, hc_eps: float, sinkhorn_iters: int):
        self.k, self.eps, self.args = kernels, norm_eps, (norm_eps, hc_eps, sinkhorn_iters)

    def mix(self, residual: torch.Tensor, hc: tuple):
        """``mhc.mix`` of ``residual`` with ``hc = (fn, base, scale)``, as a branch where ``MIX_BRANCH``."""
        if MIX_BRANCH:
            return self.k["stream.side"](self.k["mhc.mix"], residual, *hc, *self.args)
        return Joined(self.k["mhc.mix"](residual, *hc, *self.args))

    def expand(self, residual: torch.Tensor, y, mix) -> torch.Tensor:
        """The streams with the sublayer output ``y`` (a tensor, or parts that ``mhc.expand`` sums) added by ``mix``."""
        _pre, post, comb = mix.join()
        return self.k["mhc.expand"](residual, y, post, comb)

    def __call__(self, residual: torch.Tensor, y, mix_prev, hc: tuple, norm_w: torch.Tensor):
        """(streams, the previous sublayer's output or None when already expanded, its mix, this sublayer's hc and
        input norm) -> (streams', normed input h [T, D], this sublayer's mix)."""
        k = self.k
        pre, post, comb = mix_prev.join()
        if not MIX_BRANCH:
            if y is None:
                h, *mix = k["mhc.pre_norm"](residual, *hc, norm_w, *self.args, pre)
            else:
                residual, h, *mix = k["mhc.expand_pre_norm"](residual, y, post, comb, *hc, norm_w, *self.args, pre)
            return residual, h, Joined(tuple(mix))
        if y is not None:
            residual = k["mhc.expand"](residual, y, post, comb)
        mix = self.mix(residual, hc)
        return residual, k["mhc.collapse_norm"](residual, pre, norm_w, self.eps), mix
