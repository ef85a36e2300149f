"""Where a model joins its ``stream.side`` branches: as late as the op allows, and never too late.

The reference runs a branch at once, so on the CPU a misplaced join changes nothing. Here the branch is
*deferred* instead: it runs only when joined. That is the extreme order a second stream may take. If anything reads
a branch's result or what it writes (a cache row) before the join, the logits change. Two requests are run through
prefill chunks and decode steps, and the logits must equal the in-order run's bit for bit. Every branch must also
be joined within its step. Branches: the MoE layers' shared expert (V4, V4.1), with ``DEEPINFER_BRANCH_KV_WRITE``
V4.1's kv sources' KV half (SWA row, compressor, index keys), with ``DEEPINFER_BRANCH_SWA_WRITE`` the other
layers' SWA rows, with ``DEEPINFER_BRANCH_COMPRESSOR`` the compressors on their own, with
``DEEPINFER_MHC_MIX_BRANCH`` V4.1's mHC mixes, with ``DEEPINFER_ENGRAM_BRANCH`` its Engram layers' table lookups
(forked at the step's start), and with ``DEEPINFER_BRANCH_INDEX_WEIGHTS`` its index sources' head weights.
"""
from __future__ import annotations

import pytest
import torch

from deepinfer_core.runner.executor import PagedExecutor
from deepinfer_core.runner.simple_driver import run_requests
from tests.models.v41_helpers import prompt, tiny_ckpt


class _Deferred:
    """A branch that runs when joined (the latest order a side stream may take)."""

    def __init__(self, fn, args, log):
        self.fn, self.args, self.value, self.done = fn, args, None, False
        log.append(self)

    def join(self):
        if not self.done:
            self.value, self.done = self.fn(*self.args), True
        return self.value


def _run(model, requests, schedule):
    ex = PagedExecutor(model, num_blocks=256, max_num_seqs=len(requests))
    with torch.inference_mode():
        hidden = run_requests(ex, requests, schedule)
    return torch.cat([model.compute_logits(hidden[i]) for i in range(len(requests))])


def _schedule(lengths, prefill_chunk):
    """Prefill both requests in chunks of ``prefill_chunk`` (together), then one token a step each."""
    steps, pos = [], [0, 0]
    prefill = [n - 6 for n in lengths]
    while any(p < q for p, q in zip(pos, prefill)):
        step = [(i, min(prefill_chunk, q - p)) for i, (p, q) in enumerate(zip(pos, prefill)) if p < q]
        steps.append(step)
        for i, n in step:
            pos[i] += n
    for _ in range(6):
        steps.append([(0, 1), (1, 1)])
    return steps


def _model(arch, tmp_path):
    if arch == "v41":
        from deepinfer_models.deepseek_v41.loading import load_deepseek_v41

        return load_deepseek_v41(tiny_ckpt("flash", "fp8"), dtype=torch.float32)
    from deepinfer_models.deepseek_v4.loading import load_deepseek_v4
    from deepinfer_models.testing import write_tiny_v4_checkpoint

    write_tiny_v4_checkpoint(tmp_path, quant="fp8", seed=3, tokenizer=False)
    return load_deepseek_v4(tmp_path, dtype=torch.float32)


@pytest.mark.parametrize("arch,kv_branch,mix_branch,swa_branch,cmp_branch", [
    ("v41", False, False, False, False), ("v41", True, False, False, False), ("v41", True, True, False, False),
    ("v41", True, False, True, False), ("v41", True, False, False, True), ("v41", True, True, True, True),
    ("v4", False, False, False, False)])
def test_deferred_branches_give_the_in_order_logits(arch, kv_branch, mix_branch, swa_branch, cmp_branch, monkeypatch,
                                                    tmp_path):
    """``kv_branch``: V4.1's kv sources also write their KV as a branch (``DEEPINFER_BRANCH_KV_WRITE=1``), joined
    before the indexer and the attention read the caches; ``swa_branch``: every other layer's SWA row too
    (``DEEPINFER_BRANCH_SWA_WRITE=1``); ``cmp_branch``: a kv source's compressor is a branch of its own, forked
    before the ``wq_a`` / ``wkv`` GEMV (``DEEPINFER_BRANCH_COMPRESSOR=1``). ``mix_branch``: each V4.1 sublayer's
    mHC mix is a branch too (``DEEPINFER_MHC_MIX_BRANCH=1``), joined at the next boundary."""
    from deepinfer_models.deepseek_v41 import attention, hyper
    from deepinfer_models.deepseek_v41 import model as model_mod

    monkeypatch.setattr(attention, "BRANCH_KV_WRITE", kv_branch)
    monkeypatch.setattr(attention, "BRANCH_SWA_WRITE", swa_branch)
    monkeypatch.setattr(attention, "BRANCH_COMPRESSOR", cmp_branch)
    monkeypatch.setattr(hyper, "MIX_BRANCH", mix_branch)
    model = _model(arch, tmp_path)
    requests = [prompt(40, seed=11), prompt(27, seed=12)]
    schedule = _schedule([len(r) for r in requests], prefill_chunk=9)
    want = _run(model, requests, schedule)
    log: list[_Deferred] = []
    in_order = model.k["stream.side"]
    model.k["stream.side"] = lambda fn, *args: _Deferred(fn, args, log)
    try:
        got = _run(model, requests, schedule)
    finally:
        model.k["stream.side"] = in_order
    assert log, "the model declared no branch"
    assert all(b.done for b in log), f"{sum(not b.done for b in log)} of {len(log)} branches never joined"
    if kv_branch:  # a step: every layer's shared expert, the KV halves, the compressors apart, the mixes, ...
        sources = sum(layer["attn"].compressor is not None or swa_branch for layer in model.layers)
        sources += sum(layer["attn"].compressor is not None for layer in model.layers) if cmp_branch else 0
        mixes = 2 * len(model.layers) if mix_branch else 0
        lookups = sum(layer["engram"] is not None for layer in model.layers) if model_mod.ENGRAM_BRANCH else 0
        heads = sum(layer["attn"].indexer is not None for layer in model.layers) if attention.BRANCH_INDEX_WEIGHTS else 0
        assert sources >= (len(model.layers) if swa_branch else 1)
        assert len(log) == len(schedule) * (len(model.layers) + sources + mixes + lookups + heads)
    assert torch.equal(got, want)


@pytest.mark.parametrize("arch,ring_op", [("v41", False), ("v41", True), ("v4", False)])
def test_decode_shortcuts_give_the_general_formulas_logits(arch, ring_op, monkeypatch, tmp_path):
    """``DEEPINFER_DECODE_SHORTCUTS``: a decode step's ``StepRows`` without index math and the ratio-2 compressor's
    partner from the ring alone (V4.1), the compressor's slots and ring rows without gathers by ``token_seq`` (V4),
    give the general path's logits bit for bit (prefill chunks, then decode steps that close windows and pairs).
    ``ring_op``: the ratio-2 decode step through ``compress.ring_pair_pool`` (``DEEPINFER_COMPRESS_RING_POOL=1``)."""
    from deepinfer_models.deepseek_v41 import compressor
    from deepinfer_models.layers import decode_shortcuts as step

    monkeypatch.setattr(compressor, "RING_PAIR_POOL", ring_op)
    model = _model(arch, tmp_path)
    calls = []
    if ring_op:
        op = model.k["compress.ring_pair_pool"]
        model.k["compress.ring_pair_pool"] = lambda *a: calls.append(1) or op(*a)
    if arch == "v41":
        assert any(layer["attn"].compressor is not None and layer["attn"].compressor.ratio == 2
                   for layer in model.layers), "the tiny V4.1 needs a ratio-2 kv source"
    requests = [prompt(33, seed=31), prompt(20, seed=32)]
    schedule = _schedule([len(r) for r in requests], prefill_chunk=7)
    monkeypatch.setattr(step, "DECODE_SHORTCUTS", False)
    want = _run(model, requests, schedule)
    assert not calls  # the general path never takes the decode op
    monkeypatch.setattr(step, "DECODE_SHORTCUTS", True)
    assert torch.equal(_run(model, requests, schedule), want)
    assert bool(calls) == ring_op
