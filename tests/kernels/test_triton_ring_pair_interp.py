"""``compress.ring_pair_pool``'s Triton kernel (``deepinfer_nvidia/kernels/triton_compress.py``) in Triton's CPU
interpreter: the pool bit-equal to ``compress.softmax_pool``'s kernel on the stacked pair, within the reference's
tolerance, the ring written exactly as the reference writes it (the partner read first), the closing flags; and a
slot outside the ring neither read nor written."""
from __future__ import annotations

_INTERPRETED = r"""
import torch
from deepinfer_core.kernels.ops.compress import _compare_ring_pair, _gen_ring_pair, ring_pair_pool
from deepinfer_nvidia.kernels import triton_compress as tc

n = 0
for dtype in (torch.float32, torch.bfloat16):
    for seed in range(2):
        for (both, ring, slot, pos), _ in _gen_ring_pair(dtype, "cpu", seed):
            ring_k, ring_r = ring.clone(), ring.clone()
            cap, w = ring.shape[1], ring.shape[2]
            pair = torch.stack([ring[slot, (pos - 1) % cap], both], dim=1)
            pooled = tc.softmax_pool(pair[..., : w // 2], pair[..., w // 2:], force_kernel=True)
            got = tc.ring_pair_pool(both, ring_k, slot, pos, force_kernel=True)
            want = ring_pair_pool(both, ring_r, slot, pos)
            _compare_ring_pair(got, want, dtype)
            assert got[2] is ring_k and torch.equal(ring_k, ring_r)
            assert torch.equal(got[0], pooled), "not softmax_pool's kernel's bits"
            n += 1
# a slot outside the ring: nothing read or written, u NaN
both, ring = torch.randn(2, 16), torch.randn(3, 8, 16)
before = ring.clone()
u, closes, _ = tc.ring_pair_pool(both, ring, torch.tensor([5, -1]), torch.tensor([3, 4]), force_kernel=True)
assert torch.equal(ring, before) and torch.isnan(u).all() and closes.tolist() == [True, False]
print("INTERPRETED", n)
"""


def test_ring_pair_kernel_in_the_interpreter(run_interpreted):
    proc = run_interpreted(_INTERPRETED, "INTERPRETED")
    assert int(proc.stdout.split("INTERPRETED")[-1].split()[0]) == 16
