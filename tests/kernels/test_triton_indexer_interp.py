"""``index.scores``' per-token Triton launch (``deepinfer_nvidia/kernels/triton_indexer.py``) in Triton's CPU
interpreter against the reference, fp32 (the interpreter's bf16 products are not trusted), at the model's 64 heads
of 128: the small-batch shape (``SMALL_BATCH_SPLIT``: 32 candidates a program, one chunk, chunks doubled only past
two waves) and the default shape (64 a chunk, 4 chunks a program), on candidate lists with -1 entries and a
partial last chunk. The grids are checked: 1 token over 100 candidates takes 4 programs instead of 2, 40 tokens
over 300 candidates 2 chunks a program (400 programs of one chunk would exceed two waves of 132 SMs)."""
from __future__ import annotations

_INTERPRETED = r"""
import torch
from deepinfer_core.kernels.ops.indexer import indexer_scores
from deepinfer_nvidia.kernels import triton_indexer as ti

ti.supports = lambda *a: True  # CPU tensors into the interpreted kernel
g = torch.Generator().manual_seed(11)
h, d, slots = 64, 128, 500
grids = []
kernel = ti._scores_kernel
class Spy:
    def __getitem__(self, grid):
        grids.append(tuple(grid))
        return kernel[grid]
ti._scores_kernel = Spy()
for small in (True, False):
    ti.SMALL_BATCH_SPLIT = small
    for t, n in ((1, 100), (40, 300)):
        q = torch.randn(t, h, d, generator=g)
        w = torch.randn(t, h, generator=g)
        keys = torch.randn(slots, d, generator=g)
        cand = torch.randint(-1, slots, (t, n), generator=g)
        out = ti.scores(q, w, keys, cand, 0.3)
        ref = indexer_scores(q, w, keys, cand, 0.3)
        fin = torch.isfinite(ref)
        assert torch.equal(torch.isfinite(out), fin)
        torch.testing.assert_close(torch.where(fin, out, 0.0), torch.where(fin, ref, 0.0), atol=1e-4, rtol=1e-4)
# weights in bf16 (the models pass weights_proj's output as it is, its scale in score_scale): widened in the kernel
wb = w.bfloat16()
out = ti.scores(q, wb, keys, cand, 0.3 * 0.125)
ref = indexer_scores(q, wb, keys, cand, 0.3 * 0.125)
fin = torch.isfinite(ref)
torch.testing.assert_close(torch.where(fin, out, 0.0), torch.where(fin, ref, 0.0), atol=1e-4, rtol=1e-4)
grids.pop()
# per-token (batch-invariant) entry point: never the small-batch shape
ti.SMALL_BATCH_SPLIT = True
ti.scores_per_token(q[:1], w[:1], keys, cand[:1], 0.3)
assert grids == [(1, 4), (40, 5), (1, 2), (40, 2), (1, 2)], grids
print("INDEXER_OK")
"""


def test_index_scores_in_the_interpreter(run_interpreted):
    run_interpreted(_INTERPRETED, "INDEXER_OK")
