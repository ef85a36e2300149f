"""V4.1 looks up each compressed entry's cache slot (``index.entry_slots``) once per step for each (kv source, index
source) pair, not once per compressed layer: layers sharing both read the same entries (``IndexShare.entry_slots``).
Logits must be bit-equal to a lookup per layer, and the lookups a step must drop to the number of distinct pairs."""
from __future__ import annotations

import pytest
import torch

from deepinfer_core.runner.executor import PagedExecutor
from deepinfer_core.runner.simple_driver import run_requests
from deepinfer_models.deepseek_v41.checkpoint_writer import tiny_v41_config
from deepinfer_models.deepseek_v41.loading import load_deepseek_v41
from deepinfer_models.deepseek_v41.step import IndexShare
from tests.models.v41_helpers import prompt, tiny_ckpt


def _run(model, requests, schedule):
    ex = PagedExecutor(model, num_blocks=256, max_num_seqs=len(requests))
    with torch.inference_mode():
        hidden = run_requests(ex, requests, schedule)
    return torch.cat([model.compute_logits(hidden[i]) for i in range(len(requests))])


@pytest.mark.parametrize("topology", ["flash", "mixed"])
def test_one_lookup_per_source_pair(topology, monkeypatch):
    cfg = tiny_v41_config(topology)
    compressed = [L for L in range(cfg.num_hidden_layers) if cfg.ratio(L)]
    pairs = {(cfg.kv_src(L), cfg.idx_src(L)) for L in compressed}
    assert len(pairs) < len(compressed)  # the topology shares pairs, or this test shows nothing
    model = load_deepseek_v41(tiny_ckpt(topology, "fp8"), dtype=torch.float32)
    requests = [prompt(37, seed=21), prompt(30, seed=22)]
    schedule = [[(0, 20), (1, 14)], [(0, 11), (1, 10)]] + [[(0, 1), (1, 1)]] * 6  # 6 prompt tokens left each
    lookup = model.k["index.entry_slots"]
    calls = []
    model.k["index.entry_slots"] = lambda visible, sel: calls.append(1) or lookup(visible, sel)
    shared = _run(model, requests, schedule)
    n_shared = len(calls)
    calls.clear()
    monkeypatch.setattr(IndexShare, "entry_slots", lambda self, visible, sel, fn: fn(visible, sel))
    per_layer = _run(model, requests, schedule)
    assert torch.equal(shared, per_layer)
    steps = len(schedule)
    assert len(calls) == steps * len(compressed)
    assert n_shared == steps * len(pairs)


def test_new_tensors_are_new_lookups():
    """Identity, not value: an equal but distinct top-k (the replay cut's re-selected rows) is looked up again."""
    share, calls = IndexShare(), []
    lookup = lambda v, s: calls.append(1) or torch.where(s >= 0, v.gather(1, s.clamp(min=0)), -1)  # noqa: E731
    visible, sel = torch.arange(12).view(2, 6), torch.tensor([[0, 5], [-1, 2]])
    a = share.entry_slots(visible, sel, lookup)
    assert share.entry_slots(visible, sel, lookup) is a and len(calls) == 1
    b = share.entry_slots(visible, sel.clone(), lookup)
    assert torch.equal(a, b) and len(calls) == 2
    assert a.tolist() == [[0, 5], [-1, 8]]
