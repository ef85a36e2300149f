"""The token-tiled lightning-indexer kernel (``deepinfer_nvidia/kernels/triton_indexer_tiled.py``) in Triton's CPU
interpreter against ``index.scores``'s reference (fp32; the interpreter's bf16 products are not trusted):
prefill-shaped candidates (two sequences, each token a prefix of its sequence's slot list: shared key tiles,
skipped chunks, a tile across the sequence boundary) and random ones (token-by-token chunks), 2 and 4 tokens
per program, and the model's 64 heads of 128; bf16 weights (the models' own) widened in the kernel."""
from __future__ import annotations

_INTERPRETED = r"""
import torch
from deepinfer_core.kernels.ops.indexer import indexer_scores
from deepinfer_nvidia.kernels import triton_indexer_tiled as tt
from deepinfer_nvidia.tests.bench_indexer import causal_cand

g = torch.Generator().manual_seed(0)
n_cases = 0
for t, h, d, slots, bt, bn, structured in ((37, 8, 32, 100, 2, 16, True), (37, 8, 32, 100, 4, 16, True),
                                           (37, 8, 32, 100, 2, 16, False), (37, 8, 32, 100, 4, 16, False),
                                           (9, 64, 128, 60, 2, 32, True)):
    q = torch.randn(t, h, d, generator=g)
    w = torch.randn(t, h, generator=g)
    keys = torch.randn(slots, d, generator=g)
    if structured:
        cand = causal_cand([t // 3, t - t // 3], 1, slots, g)
    else:
        cand = torch.randint(-1, slots, (t, 50), generator=g)
    for chunks in (1, 2):
        out = torch.full((t, cand.shape[1]), float("nan"))
        tt.launch(q, w, keys, cand, out, 0.7, "ieee", bt=bt, block_n=bn, chunks=chunks)
        torch.testing.assert_close(out, indexer_scores(q, w, keys, cand, 0.7), atol=1e-4, rtol=1e-4)
        n_cases += 1
# bf16 weights with their scale in score_scale (as the models pass weights_proj's output): widened in the kernel
wb = w.bfloat16()
out = torch.full((t, cand.shape[1]), float("nan"))
tt.launch(q, wb, keys, cand, out, 0.7 * 0.125, "ieee", bt=2, block_n=32, chunks=1)
torch.testing.assert_close(out, indexer_scores(q, wb, keys, cand, 0.7 * 0.125), atol=1e-4, rtol=1e-4)
n_cases += 1
print("TILED_OK", n_cases)
"""


def test_tiled_index_scores_in_the_interpreter(run_interpreted):
    run_interpreted(_INTERPRETED, "TILED_OK 11")
