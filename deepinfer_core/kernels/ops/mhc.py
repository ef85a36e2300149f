"""Manifold-constrained hyper-connections (mHC): mix weights, collapse, expand.

The residual is ``R [T, n, D]`` (n = hc_mult streams). Each sublayer computes
``pre [T, n]``, ``post [T, n]`` and a doubly-stochastic ``comb [T, n, n]`` from R.

Two fused ops cover a sublayer boundary as the models run it (``OpSpec.components``: a platform without
a kernel for them runs them as their parts): ``mhc.pre_norm`` (mix, collapse, input RMSNorm) and
``mhc.expand_pre_norm`` (the previous sublayer's expand, then ``mhc.pre_norm`` on the new streams).
"""
from __future__ import annotations

import torch

from deepinfer_core.kernels.ops.linalg import down, linear_rows, up
from deepinfer_core.kernels.ops.norm import rms_norm
from deepinfer_core.kernels.spec import OpSpec, acc


def mhc_mix(residual: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor,
            norm_eps: float, hc_eps: float, sinkhorn_iters: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mix weights of one sublayer.

    residual [T, n, D]; fn [(2+n)*n, n*D] fp32; base [(2+n)*n] fp32; scale [3] fp32.
    Returns fp32 ``pre [T, n]``, ``post [T, n]``, ``comb [T, n, n]`` where
    ``m = fn . (vec(R) * rsqrt(mean(vec(R)^2) + norm_eps))``, ``pre = sigmoid(s0*m_pre + b_pre) + hc_eps``,
    ``post = 2*sigmoid(s1*m_post + b_post)``, ``comb`` = Sinkhorn of ``softmax_rows(s2*m_comb + b_comb) + hc_eps``
    (first a column normalisation, then ``iters-1`` row/column rounds).
    """
    t, n, d = residual.shape
    flat = acc(residual.reshape(t, n * d))
    flat = flat * torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + norm_eps)
    m = linear_rows(flat, acc(fn))
    base = acc(base)
    scale = acc(scale)
    pre = down(torch.sigmoid(up(m[:, :n] * scale[0] + base[:n])), m) + hc_eps
    post = 2.0 * down(torch.sigmoid(up(m[:, n:2 * n] * scale[1] + base[n:2 * n])), m)
    comb = down(up(m[:, 2 * n:].reshape(t, n, n) * scale[2] + base[2 * n:].view(n, n)).softmax(dim=-1), m) + hc_eps
    comb = comb / (comb.sum(dim=-2, keepdim=True) + hc_eps)
    for _ in range(sinkhorn_iters - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + hc_eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + hc_eps)
    return pre, post, comb


def mhc_collapse(residual: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """``x = sum_k pre[:, k] * R[:, k]`` in fp32, returned in residual.dtype. residual [T, n, D], pre [T, n]."""
    return (acc(pre).unsqueeze(-1) * acc(residual)).sum(dim=1).to(residual.dtype)


def sublayer_output(y: torch.Tensor | tuple | list) -> torch.Tensor:
    """A sublayer's output ``y`` for ``mhc.expand`` in fp32: ``y [T, D]``, or the sum of its parts, each [T, D], added
    in fp32 in the order given (the MoE hands over its routed and shared experts' outputs unsummed, so the sum costs
    no launch of its own and is never rounded to the activation dtype)."""
    if isinstance(y, torch.Tensor):
        return acc(y)
    if not isinstance(y, (tuple, list)) or not y or not all(isinstance(p, torch.Tensor) for p in y):
        raise TypeError("mhc.expand: y must be a [T, D] tensor or a non-empty tuple of them, got "
                        f"{type(y).__name__}" + (f" of {[type(p).__name__ for p in y]}" if isinstance(y, (tuple, list))
                                                 else ""))
    if any(p.shape != y[0].shape for p in y):
        raise ValueError(f"mhc.expand: y's parts must share one shape, got {[tuple(p.shape) for p in y]}")
    out = acc(y[0])
    for p in y[1:]:
        out = out + acc(p)
    return out


def mhc_expand(residual: torch.Tensor, y: torch.Tensor | tuple, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """``R'[:, j] = post[:, j] * y + sum_i comb[:, i, j] * R[:, i]`` in fp32, stored in residual.dtype.

    residual [T, n, D]; y [T, D] or a tuple of [T, D] parts summed in fp32 (``sublayer_output``); post [T, n];
    comb [T, n, n].
    """
    out = acc(post).unsqueeze(-1) * sublayer_output(y).unsqueeze(1) + torch.einsum("tij,tid->tjd", acc(comb),
                                                                                  acc(residual))
    return out.to(residual.dtype)


def mhc_head_pre(residual: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor,
                 norm_eps: float, hc_eps: float) -> torch.Tensor:
    """V4 final-head collapse weights: ``sigmoid(scale * fn . normed(vec(R)) + base) + hc_eps`` -> fp32 [T, n]."""
    t, n, d = residual.shape
    flat = acc(residual.reshape(t, n * d))
    flat = flat * torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + norm_eps)
    z = linear_rows(flat, acc(fn)) * acc(scale) + acc(base)
    return down(torch.sigmoid(up(z)), z) + hc_eps


PRE_NORM_PARTS = ("mhc.mix", "mhc.collapse", "norm.rms")
EXPAND_PRE_NORM_PARTS = ("mhc.expand",) + PRE_NORM_PARTS


def compose_pre_norm(k: dict):
    """``mhc.pre_norm`` from its parts ``k`` (``{op: callable}`` for ``PRE_NORM_PARTS``)."""
    mix, collapse, rms = k["mhc.mix"], k["mhc.collapse"], k["norm.rms"]

    def pre_norm(residual: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor,
                 norm_w: torch.Tensor, norm_eps: float, hc_eps: float, sinkhorn_iters: int,
                 collapse_pre: torch.Tensor | None = None) -> tuple:
        """The input side of a sublayer: residual [T, n, D]; ``fn, base, scale`` as ``mhc.mix``; norm_w [D]
        fp32; collapse_pre: fp32 [T, n] or None.

        Returns ``(h, pre, post, comb)``: ``pre, post, comb = mhc.mix(residual, ...)`` (fp32) and
        ``h = norm.rms(mhc.collapse(residual, p), norm_w, norm_eps)`` [T, D] in residual.dtype, with
        ``p = collapse_pre`` where given (V4.1's delayed mHC collapses with the previous sublayer's ``pre``),
        else this mix's own ``pre`` (V4).
        """
        pre, post, comb = mix(residual, fn, base, scale, norm_eps, hc_eps, sinkhorn_iters)
        h = rms(collapse(residual, pre if collapse_pre is None else collapse_pre), norm_w, norm_eps)
        return h, pre, post, comb

    return pre_norm


def compose_expand_pre_norm(k: dict):
    """``mhc.expand_pre_norm`` from its parts ``k`` (``EXPAND_PRE_NORM_PARTS``)."""
    expand, pre_norm = k["mhc.expand"], compose_pre_norm(k)

    def expand_pre_norm(residual: torch.Tensor, y: torch.Tensor | tuple, post: torch.Tensor, comb: torch.Tensor,
                        fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, norm_w: torch.Tensor,
                        norm_eps: float, hc_eps: float, sinkhorn_iters: int,
                        collapse_pre: torch.Tensor | None = None) -> tuple:
        """A sublayer boundary: the previous sublayer's output ``y [T, D]`` (or a tuple of its parts) into the
        streams with its ``post [T, n]`` and ``comb [T, n, n]`` (``mhc.expand``), then ``mhc.pre_norm`` of the new
        streams with the next sublayer's ``fn, base, scale, norm_w``. Returns ``(residual', h, pre, post', comb')``."""
        new = expand(residual, y, post, comb)
        return (new, *pre_norm(new, fn, base, scale, norm_w, norm_eps, hc_eps, sinkhorn_iters, collapse_pre))

    return expand_pre_norm


COLLAPSE_NORM_PARTS = ("mhc.collapse", "norm.rms")


def compose_collapse_norm(k: dict):
    """``mhc.collapse_norm`` from its parts ``k`` (``COLLAPSE_NORM_PARTS``)."""
    collapse, rms = k["mhc.collapse"], k["norm.rms"]

    def collapse_norm(residual: torch.Tensor, pre: torch.Tensor, norm_w: torch.Tensor, norm_eps: float
                      ) -> torch.Tensor:
        """A sublayer's input from the streams: residual [T, n, D], pre fp32 [T, n], norm_w [D] fp32 ->
        ``h = norm.rms(mhc.collapse(residual, pre), norm_w, norm_eps)`` [T, D] in residual.dtype (the collapse
        rounded to residual.dtype before the norm, as the parts store it). V4.1's delayed mHC takes ``pre`` from
        the previous sublayer, so this and ``mhc.expand`` are a boundary's whole chain (its mix runs beside)."""
        return rms(collapse(residual, pre), norm_w, norm_eps)

    return collapse_norm


_REFS = {"mhc.mix": mhc_mix, "mhc.collapse": mhc_collapse, "mhc.expand": mhc_expand, "norm.rms": rms_norm}
mhc_pre_norm = compose_pre_norm(_REFS)
mhc_expand_pre_norm = compose_expand_pre_norm(_REFS)
mhc_collapse_norm = compose_collapse_norm(_REFS)


def _gen_mix(dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    for t, n, d in [(1, 4, 8), (6, 4, 64), (3, 2, 32)]:
        yield _mix_case(dtype, device, g, t, n, d)


def _mix_case(dtype, device, g, t, n, d) -> tuple:
    """One ``mhc.mix`` case ``(args, kwargs)``: residual [t, n, d] in dtype, fp32 fn / base / scale from ``g``."""
    r = torch.randn(t, n, d, generator=g).to(dtype).to(device)
    fn = (torch.randn((2 + n) * n, n * d, generator=g) / (n * d) ** 0.5).to(device)
    base = torch.randn((2 + n) * n, generator=g).to(device)
    scale = torch.rand(3, generator=g).to(device) + 0.5
    return (r, fn, base, scale, 1e-6, 1e-6, 20), {}


def _gen_collapse(dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    for t, n, d in [(1, 4, 8), (6, 4, 64)]:
        yield (torch.randn(t, n, d, generator=g).to(dtype).to(device), torch.rand(t, n, generator=g).to(device)), {}


def _gen_expand(dtype, device, seed):
    """y as one tensor, and as two parts (the MoE's routed and shared outputs)."""
    g = torch.Generator().manual_seed(seed)
    for t, n, d, parts in [(1, 4, 8, 1), (6, 4, 64, 1), (1, 4, 8, 2), (5, 4, 96, 2)]:
        ys = tuple(torch.randn(t, d, generator=g).to(dtype).to(device) for _ in range(parts))
        yield (torch.randn(t, n, d, generator=g).to(dtype).to(device), ys[0] if parts == 1 else ys,
               torch.rand(t, n, generator=g).to(device), torch.rand(t, n, n, generator=g).to(device)), {}


def _gen_collapse_norm(dtype, device, seed):
    """Widths that are and are not powers of two, n of 4 and 2."""
    g = torch.Generator().manual_seed(seed + 7)
    for t, n, d in [(1, 4, 64), (5, 4, 160), (3, 2, 96), (17, 4, 8)]:
        r = torch.randn(t, n, d, generator=g).to(dtype).to(device)
        pre = (torch.rand(t, n, generator=g) + 0.1).to(device)
        w = (1 + 0.1 * torch.randn(d, generator=g)).float().to(device)
        yield (r, pre, w, 1e-6), {}


def _gen_head(dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    for t, n, d in [(2, 4, 16), (5, 4, 64)]:
        yield (torch.randn(t, n, d, generator=g).to(dtype).to(device), torch.randn(n, n * d, generator=g).to(device) * 0.1,
               torch.randn(n, generator=g).to(device), torch.rand(1, generator=g).to(device), 1e-6, 1e-6), {}


def _gen_pre_norm(dtype, device, seed):
    """With and without ``collapse_pre``, at the widths the fused kernels tile (D not a multiple of their tile)."""
    g = torch.Generator().manual_seed(seed)
    for t, n, d, given in [(1, 4, 64, False), (5, 4, 96, True), (17, 4, 160, False), (3, 2, 64, True)]:
        (r, fn, base, scale, *rest), _ = _mix_case(dtype, device, g, t, n, d)
        w = (1 + 0.1 * torch.randn(d, generator=g)).float().to(device)
        cpre = torch.rand(t, n, generator=g).to(device) + 0.1 if given else None
        yield (r, fn, base, scale, w, 1e-6, 1e-6, 20, cpre), {}


def _gen_expand_pre_norm(dtype, device, seed):
    g = torch.Generator().manual_seed(seed + 1)
    for (r, fn, base, scale, w, *rest), _ in _gen_pre_norm(dtype, device, seed):
        t, n, d = r.shape
        y = torch.randn(t, d, generator=g).to(dtype).to(device)
        if t % 2:  # odd rows: y as two parts (the MoE's routed and shared outputs)
            y = (y, torch.randn(t, d, generator=g).to(dtype).to(device))
        post = 2 * torch.rand(t, n, generator=g).to(device)
        comb = torch.rand(t, n, n, generator=g).to(device)
        yield (r, y, post, comb / comb.sum(-1, keepdim=True), fn, base, scale, w, *rest), {}


OPS = [
    OpSpec("mhc.mix", mhc_mix, _gen_mix),
    OpSpec("mhc.collapse", mhc_collapse, _gen_collapse),
    OpSpec("mhc.expand", mhc_expand, _gen_expand),
    OpSpec("mhc.head_pre", mhc_head_pre, _gen_head),
    OpSpec("mhc.pre_norm", mhc_pre_norm, _gen_pre_norm, components=PRE_NORM_PARTS, compose=compose_pre_norm,
           doc="mhc.mix, then norm.rms of mhc.collapse (a sublayer's input)"),
    OpSpec("mhc.collapse_norm", mhc_collapse_norm, _gen_collapse_norm, components=COLLAPSE_NORM_PARTS,
           compose=compose_collapse_norm, doc="norm.rms of mhc.collapse (a delayed-mHC sublayer's input)"),
    OpSpec("mhc.expand_pre_norm", mhc_expand_pre_norm, _gen_expand_pre_norm, components=EXPAND_PRE_NORM_PARTS,
           compose=compose_expand_pre_norm, doc="mhc.expand, then mhc.pre_norm (a sublayer boundary)"),
]
