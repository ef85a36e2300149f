"""DeepSeek-V4.1 model: full forward == the independent oracle, paged decode == full forward.

Two tiny topologies (tests/models/v41_helpers.py, checkpoint_writer.TOPOLOGIES): "flash"
(Flash scaled down) and "mixed" (compressed layer 0 with Engram, a ratio-0 layer between
compressed ones, 3-grams). Prompts of 300 tokens cross the sliding window (16 / 8) and many
candidate blocks (4 / 2 positions, 3 / 5 kept), so the two-level filter is active.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from deepinfer_core.runner.executor import PagedExecutor
from deepinfer_core.runner.simple_driver import run_requests
from deepinfer_models.deepseek_v41.loading import load_deepseek_v41
from tests.models.paged_checks import batched_decode_matches_full
from tests.models.v41_helpers import full_logits, prompt, tiny_ckpt
from tests.oracle.v41_reference import RefV41

CASES = [("flash", "none"), ("flash", "fp8"), ("mixed", "fp4")]


@pytest.fixture(scope="module", params=CASES, ids=[f"{t}-{q}" for t, q in CASES])
def case(request):
    topology, quant = request.param
    d = tiny_ckpt(topology, quant)
    return d, load_deepseek_v41(d, dtype=torch.float32)


def test_full_forward_matches_the_oracle(case):
    d, model = case
    ids = prompt(300, seed=3)
    ours = full_logits(model, ids)
    ref = RefV41(d).logits(ids)
    diff = (ours - ref).abs().max().item()
    assert diff < 1e-4, f"max |logit diff| {diff:.3g}"


def test_paged_decode_and_batching_match_full_forward(case):
    """Prefill k tokens, then decode one at a time; every k in the same steps (batched)."""
    _, model = case
    ids = prompt(300, seed=7)
    n_decode = 8
    hidden = batched_decode_matches_full(model, ids, [1, 2, 5, 16, 17, 33, 130, 280], n_decode)
    # batched == alone, bit for bit: the k=130 request on its own, same chunking
    alone = run_requests(PagedExecutor(model, num_blocks=512, max_num_seqs=1), [ids[: 130 + n_decode]],
                         [[(0, 130)]] + [[(0, 1)]] * n_decode)[0]
    assert torch.equal(alone, hidden[6])


def test_chunked_prefill_is_bit_exact():
    model = load_deepseek_v41(tiny_ckpt("mixed", "fp4"), dtype=torch.float32)
    ids = prompt(150, seed=11)
    ref = run_requests(PagedExecutor(model, num_blocks=256, max_num_seqs=1), [ids], [[(0, 150)]])[0]
    for chunk in (3, 7, 64):  # token-by-token steps are covered by the decode test
        steps = [[(0, min(chunk, 150 - s))] for s in range(0, 150, chunk)]
        got = run_requests(PagedExecutor(model, num_blocks=256, max_num_seqs=1), [ids], steps)[0]
        assert torch.equal(got, ref), f"chunk {chunk}"


def test_candidate_filter_bites():
    """With enough candidate blocks to cover the context the consumers' top-k changes: the filter is live."""
    d = tiny_ckpt("flash", "none")
    model = load_deepseek_v41(d, dtype=torch.float32)
    wide = load_deepseek_v41(d, dtype=torch.float32)
    wide.cfg = dataclasses.replace(model.cfg, candidate_topk_blocks=10_000)
    for layer in wide.layers:
        if layer["attn"].indexer is not None:
            layer["attn"].indexer.cfg = wide.cfg
    ids = prompt(300, seed=3)
    a, b = full_logits(model, ids), full_logits(wide, ids)
    assert torch.equal(a[:12], b[:12])  # 12 positions = 3 blocks of 4: nothing to filter yet
    assert (a - b).abs().max() > 1e-3


def test_engram_tables_can_stay_memory_mapped_in_host_memory():
    d = tiny_ckpt("flash", "fp8")
    model = load_deepseek_v41(d, dtype=torch.float32, engram_on_host=True)
    table = model.layers[1]["engram"].table
    assert table.dtype == torch.float8_e4m3fn
    # the table's bytes live in a mapping of the safetensors file, not in a private copy
    ptr = table.data_ptr()
    maps = [line.split() for line in open("/proc/self/maps") if "model.safetensors" in line and str(d) in line]
    spans = [tuple(int(a, 16) for a in m[0].split("-")) for m in maps]
    assert any(lo <= ptr < hi for lo, hi in spans), "the Engram table was copied instead of memory-mapped"
    ids = prompt(40, seed=2)
    assert torch.equal(full_logits(model, ids), full_logits(load_deepseek_v41(d, dtype=torch.float32), ids))
