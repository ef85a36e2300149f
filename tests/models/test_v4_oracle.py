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
from tests.oracle.hf_v4 import hf_model_from_native

QUANTS = ["none", "fp8", "fp4"]


@pytest.fixture(scope="module", params=QUANTS)
def ckpt(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(f"v4_{request.param}")
    write_tiny_v4_checkpoint(d, quant=request.param, seed=1)
    return d


def _prompt(n: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 129000, (n,), generator=g).tolist()


def _full_logits(model, ids: list[int]) -> torch.Tensor:
    ex = PagedExecutor(model, num_blocks=64, max_num_seqs=2)
    hidden = run_requests(ex, [ids], [[(0, len(ids))]])[0]
    return model.compute_logits(hidden)


@pytest.mark.parametrize("n", [5, 40, 300])
def test_full_forward_matches_transformers(ckpt, n):
    model = load_deepseek_v4(ckpt, dtype=torch.float32)
    hf = hf_model_from_native(ckpt, dtype=torch.float32)
    ids = _prompt(n, seed=n)
    ours = _full_logits(model, ids)
    with torch.no_grad():
        ref = hf(torch.tensor([ids]), use_cache=False).logits[0].float()
    diff = (ours - ref).abs().max().item()
    assert diff < 1e-4, f"max |logit diff| {diff:.3g} at n={n}"


def test_paged_decode_matches_full_forward(ckpt):
    """Prefill k tokens then decode one at a time, all k's batched in the same steps."""
    model = load_deepseek_v4(ckpt, dtype=torch.float32)
    ids = _prompt(300, seed=7)
    full = _full_logits(model, ids)
    ks = [1, 3, 4, 5, 15, 16, 17, 127, 128, 129, 255, 256, 260]
    n_decode = 12
    requests = [ids[: k + n_decode] for k in ks]
    schedule = [[(i, k) for i, k in enumerate(ks)]] + [[(i, 1) for i in range(len(ks))] for _ in range(n_decode)]
    ex = PagedExecutor(model, num_blocks=512, max_num_seqs=len(ks))
    hidden = run_requests(ex, requests, schedule)
    for i, k in enumerate(ks):
        got = model.compute_logits(hidden[i])
        diff = (got - full[: k + n_decode]).abs().max().item()
        assert diff < 1e-4, f"k={k}: max |logit diff| {diff:.3g}"


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_chunked_prefill_matches_full_forward(chunk):
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        write_tiny_v4_checkpoint(d, quant="none", seed=3)
        model = load_deepseek_v4(d, dtype=torch.float32)
        ids = _prompt(270, seed=11)
        full = _full_logits(model, ids)
        steps, pos = [], 0
        while pos < len(ids):
            n = min(chunk, len(ids) - pos)
            steps.append([(0, n)])
            pos += n
        ex = PagedExecutor(model, num_blocks=128, max_num_seqs=1)
        got = model.compute_logits(run_requests(ex, [ids], steps)[0])
        assert (got - full).abs().max().item() < 1e-4
