"""The graph-capture path of the compressors (``static_shapes``: pool every step, padded to a static
bound, writes masked) gives the same hidden states, bit for bit, as the eager path that skips steps
in which the host knows no window closes."""
from __future__ import annotations

import pytest
import torch

from deepinfer_core.runner.executor import PagedExecutor
from deepinfer_core.runner.simple_driver import run_requests
from deepinfer_models.deepseek_v4 import compressor as v4_compressor
from deepinfer_models.deepseek_v4.loading import load_deepseek_v4
from deepinfer_models.deepseek_v41 import compressor as v41_compressor
from deepinfer_models.deepseek_v41.loading import load_deepseek_v41
from deepinfer_models.testing import write_tiny_v4_checkpoint
from tests.models.v41_helpers import prompt, tiny_ckpt


def _run(model, monkeypatch, static: bool, ks: list[int]):
    if static:
        monkeypatch.setattr(v4_compressor, "closes_any", lambda ctx, r: True)
        monkeypatch.setattr(v41_compressor, "closes_any", lambda ctx, r: True)
    else:
        monkeypatch.undo()
    # prefill lengths ks; then 6 batched decode steps
    reqs = [prompt(k + 6, seed=k) for k in ks]
    schedule = [[(i, k) for i, k in enumerate(ks)]] + [[(i, 1) for i in range(len(ks))] for _ in range(6)]
    out = run_requests(PagedExecutor(model, num_blocks=512, max_num_seqs=len(ks)), reqs, schedule)
    monkeypatch.undo()
    return out


@pytest.mark.parametrize("arch", ["v4", "v41"])
def test_static_shapes_path_is_bit_identical(arch, tmp_path, monkeypatch):
    if arch == "v4":
        model = load_deepseek_v4(write_tiny_v4_checkpoint(tmp_path / "v4"), dtype=torch.float32)
    else:
        model = load_deepseek_v41(tiny_ckpt("mixed", "fp4"), dtype=torch.float32)
    for ks in ([1, 3, 5, 130], [10]):  # one request alone: steps with and without a closing pair
        eager = _run(model, monkeypatch, False, ks)
        static = _run(model, monkeypatch, True, ks)
        for i in eager:
            assert torch.equal(eager[i], static[i]), f"ks={ks}, request {i}"
