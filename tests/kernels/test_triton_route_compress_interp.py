"""``moe.route_topk`` / ``moe.route_hash`` (``triton_route.py``) and ``compress.softmax_pool``
(``triton_compress.py``) in Triton's CPU interpreter against the references, plus the wrappers' hand-off of
host operands to the references (same results, same errors)."""
from __future__ import annotations

import re

import pytest
import torch

from deepinfer_core.kernels.ops.compress import softmax_pool
from deepinfer_core.kernels.ops.moe import route_hash, route_topk

_INTERPRETED = r"""
import warnings
warnings.filterwarnings("ignore")  # numpy's notes on inf / NaN lanes the kernels mask out
import torch
import torch.nn.functional as F
from deepinfer_core.kernels.ops.compress import _gen_pool, softmax_pool
from deepinfer_core.kernels.ops.moe import _compare_route, _gen_route, route_hash, route_topk
from deepinfer_nvidia.kernels import triton_compress as tc, triton_route as tr

def scores(x):
    # the reference's sqrtsoftplus with a correctly rounded fp32 sqrt (CUDA's; torch's fp32 CPU sqrt is not)
    return F.softplus(x.double()).float().double().sqrt().float()

def stable(x, b, k, sc):
    # route_topk with exact ties going to the lower id (a stable descending sort), ids in score order
    s = scores(x)
    ids = torch.sort(s + b.float(), dim=-1, descending=True, stable=True).indices[:, :k]
    w = s.gather(1, ids)
    return w / (w.sum(-1, keepdim=True) + 1e-20) * sc, ids

def topk(x, b, k, sc, what, ref=True):
    w, i = tr.route_topk(x, b, k, sc, force_kernel=True)
    ws, iw = stable(x, b, k, sc)
    assert i.dtype == torch.long and w.dtype == torch.float32 and torch.equal(i, iw), (what, i, iw)
    torch.testing.assert_close(w, ws, atol=1e-6, rtol=1e-6, msg=str(what))
    if ref:  # no exact tie at the k-th place: torch.topk must pick the same set
        _compare_route((w, i), route_topk(x, b, k, sc), torch.float32)
    return i

n = 0
g = torch.Generator().manual_seed(11)
for seed in range(3):
    for args, _ in _gen_route(torch.float32, "cpu", seed):
        topk(*args, ("gen", seed)); n += 1
for e in (384, 257, 256):
    x, b = torch.randn(16, e, generator=g) * 2, torch.randn(e, generator=g) * 0.1
    for k in (1, 2, 6, 8):
        topk(x, b, k, 2.5, (e, k)); n += 1
# ties in the biased scores: all equal; three equal at the top with k=2; a tie made by the bias
i = topk(torch.full((3, 384), 0.7), torch.zeros(384), 8, 1.0, "all equal", ref=False)
assert torch.equal(i, torch.arange(8).expand(3, 8)); n += 1
x = torch.randn(4, 257, generator=g)
x[:, [200, 50, 100]] = 10.0
assert torch.equal(topk(x, torch.zeros(257), 2, 1.0, "boundary tie", ref=False), torch.tensor([[50, 100]] * 4)); n += 1
x = torch.full((2, 384), -5.0)
x[:, 300], x[:, 7] = 3.0, 2.0
s = scores(x[0])
b = torch.zeros(384)
b[7] = s[300] - s[7]
assert s[7] + b[7] == s[300]  # the set-up really ties
assert torch.equal(topk(x, b, 1, 1.0, "bias tie k=1", ref=False), torch.tensor([[7], [7]]))
assert torch.equal(topk(x, b, 2, 1.0, "bias tie k=2"), torch.tensor([[7, 300], [7, 300]])); n += 2
wide = torch.randn(5, 400, generator=g)
topk(wide[:, :384], torch.randn(384, generator=g), 6, 1.5, "row stride 400"); n += 1
w, i = tr.route_topk(torch.zeros(0, 384), torch.zeros(384), 6, 1.0, force_kernel=True)
assert w.shape == i.shape == (0, 6); n += 1

for e, k in ((384, 6), (257, 1), (256, 8)):
    x = torch.randn(12, e, generator=g) * 2
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(12)])
    for dt in (torch.int64, torch.int32):
        w, i = tr.route_hash(x, ids.to(dt), 1.5, force_kernel=True)
        wr, ir = route_hash(x, ids, 1.5)
        assert torch.equal(i, ir) and i.dtype == torch.long, (e, k)
        torch.testing.assert_close(w, wr, atol=1e-5, rtol=1e-5); n += 1

def pool(kv, sc, what, exact=False):
    got, want = tc.softmax_pool(kv, sc, force_kernel=True), softmax_pool(kv, sc)
    assert got.dtype == want.dtype and got.shape == want.shape, what
    assert torch.equal(got.isnan(), want.isnan()), what
    if exact:
        assert torch.equal(got.nan_to_num(), want.nan_to_num()), what
    torch.testing.assert_close(got.nan_to_num(), want.nan_to_num(), atol=1e-4, rtol=1e-4, msg=str(what))
    return got

for seed in range(3):
    for (kv, sc), _ in _gen_pool(torch.float32, "cpu", seed):
        pool(kv, sc, ("gen", seed)); n += 1
garbage = torch.tensor([float("nan"), float("inf"), -float("inf"), 3e38])
for s, d in ((128, 128), (2, 512), (8, 100)):
    # one present slot per (entry, channel), NaN / inf garbage everywhere else: kv of that slot, exactly
    kv = garbage[torch.randint(0, 4, (3, s, d), generator=g)]
    sc = torch.full((3, s, d), float("-inf"))
    at = torch.randint(0, s, (3, 1, d), generator=g)
    vals = torch.randn(3, 1, d, generator=g)
    kv.scatter_(1, at, vals)
    sc.scatter_(1, at, torch.randn(3, 1, d, generator=g) * 5)
    out = pool(kv, sc, ("one present", s, d), exact=True)
    assert torch.equal(out, vals[:, 0]); n += 1
for s, d in ((4, 512), (8, 128), (128, 64), (200, 48)):
    # random absent slots with garbage, a channel with every slot absent (NaN, as the reference)
    kv = torch.randn(5, s, d, generator=g)
    sc = torch.randn(5, s, d, generator=g) * 3
    absent = torch.rand(5, s, d, generator=g) < 0.4
    absent[:, s // 2] = False
    absent[1, :, 3] = True
    sc[absent] = float("-inf")
    kv[absent] = float("nan")
    out = pool(kv, sc, ("absent", s, d))
    assert out[1, 3].isnan() and not out[0].isnan().any(); n += 1
big = torch.randn(4, 8, 600, generator=g)
pool(big[:, :, 40:552], torch.randn(4, 8, 600, generator=g)[:, :, :512], "strided kv / score"); n += 1
assert tc.softmax_pool(torch.zeros(0, 4, 512), torch.zeros(0, 4, 512), force_kernel=True).shape == (0, 512); n += 1
print("INTERPRETED", n)
"""


def test_triton_kernels_in_the_interpreter(run_interpreted):
    """The kernels against the references in ``TRITON_INTERPRET=1`` (own process: the flag is read when the
    kernels are decorated). Skipped when triton is not installed."""
    run_interpreted(_INTERPRETED, "INTERPRETED 48")


def _same_error(fn, ref, *args):
    with pytest.raises(Exception) as want:
        ref(*args)
    with pytest.raises(want.type, match=re.escape(str(want.value))):
        fn(*args)


def test_host_operands_run_the_reference():
    """Without a GPU (and without force_kernel) the wrappers hand off: the reference's results and errors."""
    pytest.importorskip("triton")
    from deepinfer_nvidia.kernels import triton_compress as tc, triton_route as tr

    g = torch.Generator().manual_seed(3)
    x, b = torch.randn(5, 64, generator=g), torch.randn(64, generator=g)
    ids = torch.randint(0, 64, (5, 6), generator=g)
    kv, sc = torch.randn(3, 4, 32, generator=g), torch.randn(3, 4, 32, generator=g)
    assert not tr.supports_route(x, b, 6, 1.0) and not tr.supports_hash(x, ids, 1.0)
    assert not tc.supports_pool(kv, sc)
    for got, want in zip(tr.route_topk(x, b, 6, 1.5), route_topk(x, b, 6, 1.5)):
        assert torch.equal(got, want)
    for got, want in zip(tr.route_hash(x, ids, 1.5), route_hash(x, ids, 1.5)):
        assert torch.equal(got, want)
    assert torch.equal(tc.softmax_pool(kv, sc), softmax_pool(kv, sc))
    _same_error(tr.route_topk, route_topk, x, b, 65, 1.0)  # k > E
    _same_error(tr.route_topk, route_topk, x[0], b, 2, 1.0)  # 1-D logits
    _same_error(tr.route_hash, route_hash, x, ids[:, 0], 1.0)  # 1-D ids
    _same_error(tc.softmax_pool, softmax_pool, kv, sc[:, :3])  # score shape differs
