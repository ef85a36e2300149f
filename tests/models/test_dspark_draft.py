"""DSpark draft forward (deepinfer_models/deepseek_v41/dspark.py) against the independent dense
reference (tests/oracle/dspark_reference.py) on the tiny "flash" V4.1 checkpoint, whose writer
stores ``mtp.{0,1,2}`` stages, ``dspark_target_layer_ids=(1, 5, 8)`` (1 is an Engram layer, so
the after-Engram tap is exercised) and ``dspark_markov_rank=8``; window 16.

A second case, "mixed" topology with MXFP4 experts and its own draft MoE sizes
(``dspark_n_routed_experts=4``, ``dspark_num_experts_per_tok=1``), checks the quantised and
draft-expert paths against the same reference.

Several requests are prefilled in one target step (features tapped, context KV written), then
one batched draft block per request; context lengths straddle the window.
"""
from __future__ import annotations

import pytest
import torch

from deepinfer_models.deepseek_v41.checkpoint_writer import tiny_v41_config, write_tiny_v41_checkpoint

from deepinfer_core.runner.context import SeqSlice
from deepinfer_core.runner.executor import PagedExecutor
from deepinfer_core.runner.simple_driver import SimpleBlockAllocator
from deepinfer_models.deepseek_v41.dspark import DSparkDrafter, DSparkError, draft_noise, load_dspark_weights
from deepinfer_models.deepseek_v41.loading import load_deepseek_v41
from tests.models.v41_helpers import prompt, tiny_ckpt
from tests.oracle.dspark_reference import RefDSpark, noise

N = 5  # dspark_block_size of V4.1-Flash
NOISE_ID = 128799
LENGTHS = [3, 16, 21, 40]  # below, at and past the sliding window (16)
SEEDS = [None, 11, None, 12]
TEMPS = [1.0, 0.7, 1.0, 1.3]


@pytest.fixture(scope="module")
def setup():
    d = tiny_ckpt("flash", "none")
    target = load_deepseek_v41(d, dtype=torch.float32)
    drafter = DSparkDrafter(target, load_dspark_weights(d, target.cfg), num_draft_tokens=N, noise_token_id=NOISE_ID)
    return d, target, drafter


@torch.inference_mode()
def run_drafts(target, drafter, contexts, anchors, seeds, temps):
    """Prefill every context in one target step, write its draft context KV, propose one block each."""
    ex = PagedExecutor(target, num_blocks=256, max_num_seqs=len(contexts), extra_specs=drafter.kv_cache_specs())
    alloc = SimpleBlockAllocator(ex)
    tables = [alloc.tables_for(i, len(c) + N) for i, c in enumerate(contexts)]
    ctx = ex.context([SeqSlice(0, len(c), tables[i], state_slot=i) for i, c in enumerate(contexts)])
    ids = torch.tensor([t for c in contexts for t in c], dtype=torch.long)
    _, taps = target.forward_with_taps(ids, ctx, drafter.target_layer_ids)
    main_x = drafter.combine(taps)
    drafter.write_context_kv(main_x, ctx)
    bctx = ex.context([SeqSlice(len(c), N, tables[i], state_slot=i) for i, c in enumerate(contexts)])
    out = drafter.propose(torch.tensor(anchors), bctx, seeds=seeds, temperatures=temps)
    return main_x, out


@pytest.fixture(scope="module")
def batched(setup):
    _, target, drafter = setup
    contexts = [prompt(n, seed=20 + i) for i, n in enumerate(LENGTHS)]
    anchors = [prompt(1, seed=40 + i)[0] for i in range(len(LENGTHS))]
    return contexts, anchors, run_drafts(target, drafter, contexts, anchors, SEEDS, TEMPS)


def test_drafts_match_the_reference(setup, batched):
    d, _, _ = setup
    contexts, anchors, (main_x, out) = batched
    ref = RefDSpark(d)
    assert out.tokens.shape == (len(LENGTHS), N) and out.logits.shape == (len(LENGTHS), N, 129280)
    row = 0
    for b, ctx in enumerate(contexts):
        r = ref.propose(ctx, anchors[b], N, NOISE_ID, seed=SEEDS[b], temperature=TEMPS[b])
        dx = (main_x[row:row + len(ctx)] - r["main_x"]).abs().max().item()
        row += len(ctx)
        du = (out.base_logits[b] - r["U"]).abs().max().item()
        dl = (out.logits[b] - r["logits"]).abs().max().item()
        dc = (out.confidence[b] - r["confidence"]).abs().max().item()
        assert dx < 1e-4, f"request {b} (P={len(ctx)}): main_x diff {dx:.3g}"
        assert du < 1e-4, f"request {b} (P={len(ctx)}): base logit diff {du:.3g}"
        assert dl < 1e-4, f"request {b} (P={len(ctx)}): Markov logit diff {dl:.3g}"
        assert dc < 1e-4, f"request {b} (P={len(ctx)}): confidence diff {dc:.3g}"
        assert out.tokens[b].tolist() == r["tokens"].tolist(), f"request {b}: draft tokens differ"
        # the Markov head actually changes the logits (else the sequential loop is untested)
        assert (out.logits[b] - out.base_logits[b]).abs().max().item() > 1e-3


@pytest.fixture(scope="module")
def draft_moe_case(tmp_path_factory):
    cfg = tiny_v41_config("mixed", dspark_n_routed_experts=4, dspark_num_experts_per_tok=1)
    d = write_tiny_v41_checkpoint(tmp_path_factory.mktemp("dspark-mixed"), cfg, quant="fp4", seed=2)
    target = load_deepseek_v41(d, dtype=torch.float32)
    return d, target, DSparkDrafter(target, load_dspark_weights(d, target.cfg), num_draft_tokens=N,
                                    noise_token_id=NOISE_ID)


def test_quantised_with_draft_expert_counts_matches_the_reference(draft_moe_case):
    d, target, drafter = draft_moe_case
    assert drafter.layers[0]["ffn"].bias.shape == (4,)  # the draft MoE really has its own size
    contexts, anchors, seeds = [prompt(6, seed=1), prompt(19, seed=2)], [17, 4242], [None, 5]
    _, out = run_drafts(target, drafter, contexts, anchors, seeds, [1.0, 0.9])
    ref = RefDSpark(d)
    for b, ctx in enumerate(contexts):
        r = ref.propose(ctx, anchors[b], N, NOISE_ID, seed=seeds[b], temperature=[1.0, 0.9][b])
        dl = (out.logits[b] - r["logits"]).abs().max().item()
        dc = (out.confidence[b] - r["confidence"]).abs().max().item()
        assert dl < 1e-4 and dc < 1e-4, f"request {b}: logit diff {dl:.3g}, confidence diff {dc:.3g}"
        assert out.tokens[b].tolist() == r["tokens"].tolist()


def test_greedy_drafts_are_the_argmax_chain(batched):
    _, anchors, (_, out) = batched
    for b, s in enumerate(SEEDS):
        if s is None:
            assert out.tokens[b].tolist() == out.logits[b].argmax(-1).tolist()
    assert ((out.confidence > 0) & (out.confidence < 1)).all()


def test_batched_equals_alone_bit_exactly(setup, batched):
    _, target, drafter = setup
    contexts, anchors, (main_x, out) = batched
    for b in (1, 3):
        _, alone = run_drafts(target, drafter, [contexts[b]], [anchors[b]], [SEEDS[b]], [TEMPS[b]])
        assert torch.equal(alone.logits[0], out.logits[b])
        assert torch.equal(alone.tokens[0], out.tokens[b])
        assert torch.equal(alone.confidence[0], out.confidence[b])


def test_draft_noise_is_keyed_by_seed_and_position():
    a = draft_noise(5, 100, 1000)
    assert torch.equal(a, draft_noise(5, 100, 1000)) and torch.equal(a, noise(5, 100, 1000))
    assert not torch.equal(a, draft_noise(5, 101, 1000)) and not torch.equal(a, draft_noise(6, 100, 1000))
    with pytest.raises(TypeError, match="seed must be an int"):
        draft_noise("5", 0, 10)


def test_draft_caches_share_the_target_swa_group(setup):
    _, target, drafter = setup
    ex = PagedExecutor(target, num_blocks=8, max_num_seqs=1, extra_specs=drafter.kv_cache_specs())
    names = list(drafter.kv_cache_specs())
    assert names == [f"layers.{10 + i}.attn.swa" for i in range(3)]
    assert {ex.cache_group[n] for n in names} == {ex.cache_group["layers.0.attn.swa"]}


def test_bad_inputs_are_named(setup):
    d, target, drafter = setup
    w = load_dspark_weights(d, target.cfg)
    with pytest.raises(DSparkError, match="noise_token_id"):
        DSparkDrafter(target, w, num_draft_tokens=N, noise_token_id=10 ** 9)
    with pytest.raises(DSparkError, match="num_draft_tokens"):
        DSparkDrafter(target, w, num_draft_tokens=0, noise_token_id=1)
    with pytest.raises(DSparkError, match="main_norm.weight is missing"):
        DSparkDrafter(target, {k: v for k, v in w.items() if "main_norm" not in k}, num_draft_tokens=N,
                      noise_token_id=1)
    with pytest.raises(DSparkError, match="target features for layers"):
        drafter.combine({1: torch.zeros(2, 64)})
    ex = PagedExecutor(target, num_blocks=16, max_num_seqs=1, extra_specs=drafter.kv_cache_specs())
    tables = SimpleBlockAllocator(ex).tables_for(0, 10)
    with pytest.raises(DSparkError, match="5 tokens"):
        drafter.propose(torch.tensor([3]), ex.context([SeqSlice(4, 3, tables)]))


@torch.inference_mode()
def test_forward_with_taps_leaves_the_target_forward_unchanged(setup):
    _, target, drafter = setup
    ids = prompt(20, seed=9)

    def step():
        ex = PagedExecutor(target, num_blocks=64, max_num_seqs=1)
        tables = SimpleBlockAllocator(ex).tables_for(0, len(ids))
        return ex.context([SeqSlice(0, len(ids), tables)])

    plain = target.forward(torch.tensor(ids), step())
    tapped, taps = target.forward_with_taps(torch.tensor(ids), step(), (0, 1, 8))
    assert torch.equal(plain, tapped)
    assert sorted(taps) == [0, 1, 8] and all(t.shape == (20, 64) for t in taps.values())
    assert torch.equal(taps[0], target.embed[torch.tensor(ids)])  # layer 0's input stream: n copies of the embed
    with pytest.raises(ValueError, match="tap layer 10 is out of range"):
        target.forward_with_taps(torch.tensor(ids), step(), (10,))
