"""Per-request state is indexed by position, so tokens later rejected (speculative decoding) leave no trace.

A request is run to position P; a step then feeds 6 wrong "draft" tokens at P..P+5 (they write SWA,
compressed, index-key, ratio-2 ring and Engram history state); the next step re-feeds the accepted
tokens from P on. Every hidden state from P on must equal a run that never saw the wrong tokens.
"""
from __future__ import annotations

import pytest
import torch

from deepinfer_core.runner.context import SeqSlice
from deepinfer_core.runner.executor import PagedExecutor
from deepinfer_core.runner.simple_driver import SimpleBlockAllocator
from deepinfer_models.deepseek_v41.loading import load_deepseek_v41
from tests.models.v41_helpers import tiny_ckpt


def _run(model, steps):
    """steps: list of (start_pos, token ids); returns the hidden states of the last step."""
    ex = PagedExecutor(model, 256, 1)
    alloc = SimpleBlockAllocator(ex)
    out = None
    for start, ids in steps:
        tables = alloc.tables_for(0, start + len(ids))
        out = ex.run(torch.tensor(ids), [SeqSlice(start, len(ids), tables, 0)])
    return out


@pytest.mark.parametrize("p0", [101, 130])  # odd and even boundary for the ratio-2 pairs
def test_rejected_tokens_leave_no_state_behind(p0):
    d = tiny_ckpt("flash", "none")
    model = load_deepseek_v41(d, dtype=torch.float32)
    g = torch.Generator().manual_seed(p0)
    seq = torch.randint(3, 129000, (p0 + 12,), generator=g).tolist()
    wrong = torch.randint(3, 129000, (6,), generator=g).tolist()
    clean = _run(model, [(0, seq[:p0]), (p0, seq[p0:])])
    dirty = _run(model, [(0, seq[:p0]), (p0, wrong), (p0, seq[p0:])])
    assert torch.equal(clean, dirty)
