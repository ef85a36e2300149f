"""DeepSeek-V4 against transformers' stateless forward, and paged decode == full forward.

Tiny fp32 model (window 16, ratios 0/4/128/4, one hash layer), none/fp8/fp4 checkpoints.
"""
from __future__ import annotations

import pytest
import torch

from deepinfer_core.runner.executor import PagedExecutor
from deepinfer_core.runner.simple_driver import run_requests
from deepinfer_models.deepseek_v4.loading import load_deepseek_v4
from deepinfer_models.testing import write_tiny_v4_checkpoint
from tests.models.paged_checks import batched_decode_matches_full, full_logits, prompt
from tests.oracle.hf_v4 import hf_model_from_native

QUANTS = ["none", "fp8", "fp4"]


@pytest.fixture(scope="module", params=QUANTS)
def ckpt(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(f"v4_{request.param}")
    write_tiny_v4_checkpoint(d, quant=request.param, seed=1)
    return d


@pytest.mark.parametrize("n", [5, 40, 300])
def test_full_forward_matches_transformers(ckpt, n):
    model = load_deepseek_v4(ckpt, dtype=torch.float32)
    hf = hf_model_from_native(ckpt, dtype=torch.float32)
    ids = prompt(n, seed=n)
    ours = full_logits(model, ids)
    with torch.no_grad():
        ref = hf(torch.tensor([ids]), use_cache=False).logits[0].float()
    diff = (ours - ref).abs().max().item()
    assert diff < 1e-4, f"max |logit diff| {diff:.3g} at n={n}"


def test_paged_decode_matches_full_forward(ckpt):
    """Prefill k tokens then decode one at a time, all k's batched in the same steps."""
    model = load_deepseek_v4(ckpt, dtype=torch.float32)
    batched_decode_matches_full(model, prompt(300, seed=7), [1, 3, 4, 5, 15, 16, 17, 127, 128, 129, 255, 256, 260],
                                12)


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_chunked_prefill_matches_full_forward(chunk):
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        write_tiny_v4_checkpoint(d, quant="none", seed=3)
        model = load_deepseek_v4(d, dtype=torch.float32)
        ids = prompt(270, seed=11)
        full = full_logits(model, ids)
        steps, pos = [], 0
        while pos < len(ids):
            n = min(chunk, len(ids) - pos)
            steps.append([(0, n)])
            pos += n
        ex = PagedExecutor(model, num_blocks=128, max_num_seqs=1)
        got = model.compute_logits(run_requests(ex, [ids], steps)[0])
        assert (got - full).abs().max().item() < 1e-4
