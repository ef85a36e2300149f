"""The fused mHC sublayer boundary (``deepinfer_nvidia/kernels/triton_mhc_fused.py``: ``mhc.pre_norm`` and
``mhc.expand_pre_norm`` in two launches) in Triton's CPU interpreter against the references (the composition
of ``mhc.mix``, ``mhc.expand``, ``mhc.collapse`` and ``norm.rms``):

- fp32 and bf16 residuals, with and without ``collapse_pre``, token counts across a ``BLOCK_T`` tile, a width
  whose D ranges end inside a tile;
- launch shapes: the row normed in pieces (the default at D > 1024; here 64 columns on two warps), or whole;
- D 1040 at one token: 64 D ranges of 32 columns, the 33rd partial and the rest empty (they must add zeros);
  V4.1's own width (5120) splits evenly and runs on the device (``test_conformance_mhc_fused.py``);
- batch invariance: rows of a 20-token call equal those rows in a 17-token call and alone, bit for bit;
- bad shapes raise a ValueError naming the operand.

The interpreter's bf16 ``tl.dot`` is wrong (``test_triton_mhc_mix_interp.py``), so the bf16-pieces product is
turned off here (``split_fn=False``) and checked on the GPU (``deepinfer_nvidia/tests/test_conformance_mhc_fused.py``).
"""
from __future__ import annotations

import torch

from deepinfer_core.kernels.ops.mhc import mhc_expand_pre_norm, mhc_pre_norm

_INTERPRETED = r"""
import torch
from deepinfer_core.kernels.ops.mhc import mhc_pre_norm, mhc_expand_pre_norm
from deepinfer_nvidia.kernels import triton_mhc_fused as fz

g = torch.Generator().manual_seed(7)
KW = dict(force_kernel=True, split_fn=False)


def weights(n, d):
    fn = torch.randn((2 + n) * n, n * d, generator=g) / (n * d) ** 0.5
    return fn, torch.randn((2 + n) * n, generator=g), torch.rand(3, generator=g) + 0.5, 1 + 0.1 * torch.randn(d, generator=g)


def inputs(t, n, d, dtype):
    comb = torch.rand(t, n, n, generator=g)
    return (torch.randn(t, n, d, generator=g).to(dtype), torch.randn(t, d, generator=g).to(dtype),
            2 * torch.rand(t, n, generator=g), comb / comb.sum(-1, keepdim=True))


def close(out, ref, dtype):
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    assert len(out) == len(ref)
    for o, r in zip(out, ref):
        assert o.dtype == r.dtype and o.shape == r.shape, (o.dtype, r.dtype, o.shape, r.shape)
        torch.testing.assert_close(o, r, **tol)


cases = 0
n, d = 4, 160
fn, base, scale, w = weights(n, d)
for t, dtype, given in ((1, torch.float32, False), (18, torch.float32, True), (3, torch.bfloat16, True),
                        (17, torch.bfloat16, False)):
    r, y, post, comb = inputs(t, n, d, dtype)
    cpre = torch.rand(t, n, generator=g) + 0.1 if given else None
    close(fz.pre_norm(r, fn, base, scale, w, 1e-6, 1e-6, 20, cpre, **KW),
          mhc_pre_norm(r, fn, base, scale, w, 1e-6, 1e-6, 20, cpre), dtype)
    close(fz.expand_pre_norm(r, y, post, comb, fn, base, scale, w, 1e-6, 1e-6, 20, cpre, **KW),
          mhc_expand_pre_norm(r, y, post, comb, fn, base, scale, w, 1e-6, 1e-6, 20, cpre), dtype)
    cases += 2

# launch shapes (``launch``): the row normed in 64-column pieces (the last short) on two warps, fewer and wider D
# ranges; and the whole row in one piece
for launch in (dict(chunk=64, gate_warps=2, splits=8, block_d=32), dict(chunk=1 << 20, gate_warps=4)):
    r, y, post, comb = inputs(18, n, d, torch.float32)
    cpre = torch.rand(18, n, generator=g) + 0.1
    close(fz.expand_pre_norm(r, y, post, comb, fn, base, scale, w, 1e-6, 1e-6, 20, cpre, launch=launch, **KW),
          mhc_expand_pre_norm(r, y, post, comb, fn, base, scale, w, 1e-6, 1e-6, 20, cpre), torch.float32)
    cases += 1

# a width whose D ranges run past D: 64 ranges of 32 columns for 1040 (the 33rd partial, the rest empty: they must
# add zeros)
n, d = 4, 1040
fn, base, scale, w = weights(n, d)
r, y, post, comb = inputs(1, n, d, torch.bfloat16)
cpre = torch.rand(1, n, generator=g) + 0.1
close(fz.expand_pre_norm(r, y, post, comb, fn, base, scale, w, 1e-6, 1e-6, 20, cpre, **KW),
      mhc_expand_pre_norm(r, y, post, comb, fn, base, scale, w, 1e-6, 1e-6, 20, cpre), torch.bfloat16)
cases += 1

# batch invariance, bit for bit: the first 17 rows of a 20-token call (two BLOCK_T tiles, the second short) equal
# a 17-token call, and rows 0 and 16 (each first in its tile) equal the row alone. (The interpreter's dot is
# numpy's matmul, whose rounding depends on a row's place in the tile; a GPU program computes each row alike,
# checked there.) Three Sinkhorn rounds: the gate is one program a token either way.
n, d = 4, 96
fn, base, scale, w = weights(n, d)
r, y, post, comb = inputs(20, n, d, torch.bfloat16)
cpre = torch.rand(20, n, generator=g) + 0.1
big = fz.expand_pre_norm_bi(r, y, post, comb, fn, base, scale, w, 1e-6, 1e-6, 3, cpre, **KW)
for rows in (slice(0, 17), slice(0, 1), slice(16, 17)):
    got = fz.expand_pre_norm_bi(r[rows], y[rows], post[rows], comb[rows], fn, base, scale, w, 1e-6, 1e-6, 3,
                                cpre[rows], **KW)
    for a, b in zip(got, big):
        assert torch.equal(a, b[rows]), rows
    cases += 1

# bad shapes name the operand
for bad, name in ((dict(norm_w=w[:-1]), "norm_w"), (dict(collapse_pre=cpre[:, :2]), "collapse_pre")):
    args = dict(norm_w=w, collapse_pre=cpre)
    args.update(bad)
    try:
        fz.pre_norm(r, fn, base, scale, args["norm_w"], 1e-6, 1e-6, 20, args["collapse_pre"], **KW)
    except ValueError as exc:
        assert name in str(exc), exc
        cases += 1
print("INTERPRETED", cases)
"""


def test_fused_boundary_in_the_interpreter(run_interpreted):
    run_interpreted(_INTERPRETED, "INTERPRETED 16", timeout=600)


def test_fused_ops_off_run_their_parts_exactly(monkeypatch):
    """Switched off (the default), the nvidia entry points are the parts, and on CPU tensors the parts hand off
    to the references: the result is the reference's, bit for bit."""
    import pytest

    pytest.importorskip("triton")
    from deepinfer_nvidia.kernels import triton_mhc_fused as fz

    monkeypatch.setattr(fz, "FUSED", False)
    g = torch.Generator().manual_seed(3)
    t, n, d = 5, 4, 64
    r, y = torch.randn(t, n, d, generator=g), torch.randn(t, d, generator=g)
    post, comb = torch.rand(t, n, generator=g), torch.rand(t, n, n, generator=g)
    fn, base = torch.randn(24, n * d, generator=g) / 16, torch.randn(24, generator=g)
    scale, w, cpre = torch.rand(3, generator=g) + 0.5, torch.rand(d, generator=g) + 0.5, torch.rand(t, n, generator=g)
    for bi in (False, True):
        got = fz.expand_pre_norm(r, y, post, comb, fn, base, scale, w, 1e-6, 1e-6, 7, cpre, batch_invariant=bi)
        want = mhc_expand_pre_norm(r, y, post, comb, fn, base, scale, w, 1e-6, 1e-6, 7, cpre)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
        got = fz.pre_norm(r, fn, base, scale, w, 1e-6, 1e-6, 7, batch_invariant=bi)
        assert all(torch.equal(a, b) for a, b in zip(got, mhc_pre_norm(r, fn, base, scale, w, 1e-6, 1e-6, 7)))
