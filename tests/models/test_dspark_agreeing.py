"""Acceptance really happens: DSpark drafts of the agreeing tiny V4.1 checkpoint
(deepinfer_models/deepseek_v41/agreeing_checkpoint.py) are accepted by its own target.

The checkpoint is loaded like a real one (``load_deepseek_v41`` fp32, ``load_dspark_weights``)
and run through the speculative round without the engine: one batched target prefill (features
tapped, draft context KV written), the anchor = the target's greedy token at position P, one
draft block of N = 5, then a target verification step over ``[anchor, drafts]`` at positions
P..P+5 reusing the prefill's caches (the real verification inputs). A draft is accepted while it
equals the target's greedy token at the previous position.

One request per anchor token of the language (32), context lengths from 3 to 90 (below, at and
past the sliding window 16, past 64).
"""
from __future__ import annotations

import pytest
import torch

from deepinfer_core.runner.context import SeqSlice
from deepinfer_core.runner.executor import PagedExecutor
from deepinfer_core.runner.simple_driver import SimpleBlockAllocator
from deepinfer_models.deepseek_v41.agreeing_checkpoint import write_agreeing_v41_checkpoint
from deepinfer_models.deepseek_v41.dspark import DSparkDrafter, load_dspark_weights
from deepinfer_models.deepseek_v41.loading import load_deepseek_v41

N = 5  # dspark_block_size of V4.1-Flash
NOISE_ID = 128799
LENGTHS = [3, 15, 16, 17, 33, 65, 90, 8]  # cycled over the requests


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("agreeing-v41")
    lang = write_agreeing_v41_checkpoint(d)
    target = load_deepseek_v41(d, dtype=torch.float32)
    drafter = DSparkDrafter(target, load_dspark_weights(d, target.cfg), num_draft_tokens=N, noise_token_id=NOISE_ID)
    return lang, target, drafter


def _argmax(target, hidden: torch.Tensor) -> torch.Tensor:
    return torch.cat([target.compute_logits(h).argmax(-1) for h in hidden.split(64)])


@pytest.fixture(scope="module")
def spec_round(setup):
    """Prefill, draft and verify one request per anchor token; returns everything per request."""
    lang, target, drafter = setup
    m = len(lang.tokens)
    lengths = [LENGTHS[i % len(LENGTHS)] for i in range(m)]
    # start so that the anchor (the token after the context) is tokens[i]: every anchor once
    contexts = [lang.prompt(n, lang.tokens[(i - n) % m]) for i, n in enumerate(lengths)]
    with torch.inference_mode():
        ex = PagedExecutor(target, num_blocks=1024, max_num_seqs=m, extra_specs=drafter.kv_cache_specs())
        alloc = SimpleBlockAllocator(ex)
        tables = [alloc.tables_for(i, len(c) + N + 1) for i, c in enumerate(contexts)]
        ctx = ex.context([SeqSlice(0, len(c), tables[i], state_slot=i) for i, c in enumerate(contexts)])
        ids = torch.tensor([t for c in contexts for t in c], dtype=torch.long)
        hidden, taps = target.forward_with_taps(ids, ctx, drafter.target_layer_ids)
        prefill_greedy = _argmax(target, hidden)
        last = torch.tensor(lengths).cumsum(0) - 1
        anchors = prefill_greedy[last]
        drafter.write_context_kv(drafter.combine(taps), ctx)
        bctx = ex.context([SeqSlice(len(c), N, tables[i], state_slot=i) for i, c in enumerate(contexts)])
        out = drafter.propose(anchors, bctx)
        verify_ids = torch.cat([anchors[:, None], out.tokens], dim=1)  # [B, N+1] at positions P..P+N
        vctx = ex.context([SeqSlice(len(c), N + 1, tables[i], state_slot=i) for i, c in enumerate(contexts)])
        verify_greedy = _argmax(target, target.forward(verify_ids.reshape(-1), vctx)).view(m, N + 1)
    return contexts, prefill_greedy, anchors, out, verify_greedy


def _accepted(drafts: list[int], greedy: list[int]) -> int:
    k = 0
    while k < len(drafts) and drafts[k] == greedy[k]:
        k += 1
    return k


def test_language_and_layout(setup):
    lang, target, drafter = setup
    assert len(lang.tokens) == 32 and len(lang.agree) == 28 and lang.agree <= set(lang.tokens)
    assert all(lang.draft_next(t) != lang.target_next(t) for t in set(lang.tokens) - lang.agree)
    assert all(lang.draft_next(t) == lang.target_next(t) for t in lang.agree)
    p = lang.prompt(40, lang.tokens[5])
    assert all(b == lang.target_next(a) for a, b in zip(p, p[1:]))
    assert target.cfg.dspark_markov_rank == 33 and drafter.conf_w.shape == (1, 64 + 33)


def test_target_greedy_follows_the_language(setup, spec_round):
    lang, _, _ = setup
    contexts, prefill_greedy, anchors, out, verify_greedy = spec_round
    flat = [t for c in contexts for t in c]
    assert prefill_greedy.tolist() == [lang.target_next(t) for t in flat]  # every position of every prompt
    assert anchors.tolist() == [lang.target_next(c[-1]) for c in contexts]
    assert sorted(anchors.tolist()) == sorted(lang.tokens)  # every anchor exactly once
    # the verification step (positions P..P+N, teacher-forced on [anchor, drafts]) follows it too
    fed = torch.cat([anchors[:, None], out.tokens], dim=1)
    assert verify_greedy.tolist() == [[lang.target_next(t) for t in row] for row in fed.tolist()]


def test_drafts_follow_the_draft_rule_and_get_accepted(setup, spec_round):
    lang, _, _ = setup
    _, _, anchors, out, verify_greedy = spec_round
    accepted = []
    for b, a in enumerate(anchors.tolist()):
        want, t = [], a
        for _ in range(N):
            t = lang.draft_next(t)
            want.append(t)
        assert out.tokens[b].tolist() == want, f"anchor {a}: drafts are not the draft_next chain"
        k = _accepted(out.tokens[b].tolist(), verify_greedy[b].tolist())
        assert k == lang.accepted_length(a, N)
        accepted.append(k)
    mean = sum(accepted) / len(accepted)
    assert mean == pytest.approx(lang.mean_accepted(N))
    assert mean > 3.0, f"mean accepted length {mean:.3f} of {N}"
    assert 0 < accepted.count(N) < len(accepted)  # some blocks fully accepted, some cut short
    # the drafts come from the Markov head: the base logits are negligible
    assert out.base_logits.abs().max().item() < 0.1


def test_confidence_predicts_rejection(setup, spec_round):
    lang, _, _ = setup
    _, _, anchors, out, verify_greedy = spec_round
    prev = torch.cat([anchors[:, None], out.tokens[:, :-1]], dim=1)  # prev_k of draft k
    in_a = torch.tensor([[t in lang.agree for t in row] for row in prev.tolist()])
    conf = out.confidence
    assert in_a.any() and (~in_a).any()
    assert conf[in_a].min().item() > 0.9 and conf[~in_a].max().item() < 0.1
    for b in range(len(anchors)):  # confident up to the first rejected draft, not on it
        k = _accepted(out.tokens[b].tolist(), verify_greedy[b].tolist())
        assert (conf[b, :k] > 0.9).all()
        if k < N:
            assert conf[b, k] < 0.1
