"""``sample.topk_topp_minp``'s Triton kernel (``deepinfer_nvidia/kernels/triton_sampling.py``) against the reference
in Triton's CPU interpreter: the op's own cases (the harness comparator: identical -inf mask), then hard cases:
exact ties (bf16-rounded logits, four distinct values, all-equal rows, +0.0 / -0.0), ties at the k-th value,
top_k 1 / 2 / V - 1 / V / 0 / -1, top_p 1e-6 / 0 / 0.999 / off, min_p up to 1.0, -inf entries and an all -inf row,
and two V = 129280 (DeepSeek V4) rows streamed in many chunks. fp32 logits only (the interpreter mishandles bf16).

Hard cases allow a mask difference only at tokens whose decision hinges on fp32 rounding (top-p mass before the
token within 2e-5 of p, or a probability within 2e-5 of min-p's threshold, found in float64): the kernel's
documented caveat; the number of such differences is printed. Kept values must equal the logits bit for bit.
"""
from __future__ import annotations


_INTERPRETED = r"""
import time
import torch
from deepinfer_core.kernels.ops.sampling import (_compare_masked, _gen_filters, rounding_boundary_tokens,
                                                 topk_topp_minp)
from deepinfer_nvidia.kernels import triton_sampling as ts

NEG = float("-inf")


def near_boundary(x, top_k, top_p, min_p):
    return rounding_boundary_tokens(x, top_k, top_p, min_p, tol=2e-5)


def check(x, top_k, top_p, min_p):
    out = ts.topk_topp_minp(x, top_k, top_p, min_p, force_kernel=True)
    ref = topk_topp_minp(x, top_k, top_p, min_p)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    om, rm = torch.isneginf(out), torch.isneginf(ref)
    diff = om != rm
    bad = diff & ~near_boundary(x, top_k, top_p, min_p)
    assert not bad.any(), ("masks differ", bad.nonzero()[:8].tolist(), top_k.tolist(), top_p.tolist(),
                           min_p.tolist())
    assert torch.equal(out[~om], x[~om]), "kept logits changed"
    return int(diff.sum())


def hard_cases(v, seed):
    g = torch.Generator().manual_seed(seed)
    rnd = 2 * torch.randn(8, v, generator=g)
    zeros = torch.zeros(8, v)
    zeros[1, ::3] = -0.0
    kth = torch.full((8, v), -3.0)  # 5, then four 4s, then 3s: ties at the k-th value for k = 2..5
    kth[:, :5] = torch.tensor([5.0, 4.0, 4.0, 4.0, 4.0])
    kth[:, 40:60] = 3.0
    kth = kth[:, torch.randperm(v, generator=g)]
    infs = rnd.clone()
    infs[0, v // 3:] = NEG
    infs[1, :] = NEG
    infs[1, 5] = 1.0
    infs[2, :] = NEG
    infs[3, ::2] = NEG
    infs[4] = torch.tensor([0.0, -0.0, 1.0, -1.0]).repeat(v // 4 + 1)[:v]
    ks = torch.tensor([1, 2, 7, 50, v, v - 1, 0, -1])
    ps = torch.tensor([1e-6, 0.3137, 0.9071, 0.999, 0.5003, 1.0, 0.0, 0.7311])
    mps = torch.tensor([0.0, 0.0, 0.3, 0.0, 0.9, 1.0, 0.05, 0.0])
    for x in (rnd.bfloat16().float(), torch.randint(0, 4, (8, v), generator=g).float() * 0.5, zeros, kth, infs):
        yield x, ks, ps, mps
        yield x, ks.roll(3), ps.roll(1), mps.roll(5)
    yield kth, torch.tensor([2, 3, 4, 5, 6, 25, 26, 30]), torch.ones(8), torch.zeros(8)
    yield infs, torch.full((8,), v // 2), torch.full((8,), 0.95), torch.zeros(8)


t0 = time.time()
n = 0
for seed in range(2):
    for (x, k, p, mp), _ in _gen_filters(torch.float32, "cpu", seed):
        _compare_masked(ts.topk_topp_minp(x, k, p, mp, force_kernel=True), topk_topp_minp(x, k, p, mp),
                        torch.float32)
        n += 1
t1 = time.time()
tolerated = 0
for case in hard_cases(3001, 7):
    tolerated += check(*case)
    n += 1
t2 = time.time()
g = torch.Generator().manual_seed(11)
big = (3 * torch.randn(2, 129280, generator=g)).bfloat16().float()
tolerated += check(big, torch.tensor([50, 0]), torch.tensor([0.9071, 0.95]), torch.tensor([0.0, 0.0]))
n += 1
print(f"times: generated {t1 - t0:.1f}s, hard {t2 - t1:.1f}s, V=129280 {time.time() - t2:.1f}s; "
      f"tolerated rounding differences: {tolerated}")
print("INTERPRETED", n)
"""


def test_filter_kernel_in_the_interpreter(run_interpreted):
    """Own process: ``TRITON_INTERPRET`` is read when the kernels are decorated. Skipped without triton."""
    run_interpreted(_INTERPRETED, "INTERPRETED 21")
