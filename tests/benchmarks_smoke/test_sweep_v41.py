"""``benchmarks/sweep.py --arch v41`` at tiny widths on the CPU: the slice's random weights have
exactly the loader's layout, the model built from them runs a decode step through the sweep's own
helpers, the roofline byte accounting counts every target tensor once, and ``--save-checkpoint``
writes a directory ``LLM`` loads (DSpark stages included)."""
from __future__ import annotations

import pytest
import torch

from benchmarks import sweep, sweep_slice
from benchmarks.sweep_slice_v41 import save_checkpoint, spec_bytes, tensor_bytes_read
from deepinfer_models.deepseek_v41.checkpoint_writer import _all_specs
from deepinfer_models.deepseek_v41.weights import expected_tensors


@pytest.fixture(scope="module")
def cfg():
    return sweep_slice.arch_config("v41", None, [], "fp4", tiny=True)


@pytest.fixture(scope="module")
def weights(cfg):
    return sweep_slice.build_weights(cfg, "cpu", draft=True)


def test_topology_has_every_layer_kind(cfg):
    assert cfg.num_hidden_layers == 8 and cfg.compress_ratios == (0, 0, 2, 2, 2, 1, 1, 1)
    assert cfg.kv_source_layer_ids == (2, 5) and cfg.index_source_layer_ids == (2, 4, 5, 7)
    assert cfg.candidate_source_layer_id == 5 and cfg.is_candidate_consumer(7)
    assert cfg.engram_layer_ids == (1, 4) and not cfg.owns_index_keys(4)
    full = sweep_slice.arch_config("v41", None, [], "fp4")
    assert (full.hidden_size, full.q_lora_rank, full.n_routed_experts, full.moe_intermediate_size,
            full.index_n_heads, full.vocab_size) == (5120, 1280, 384, 2304, 32, 129280)
    assert full.compress_ratios == cfg.compress_ratios and tuple(full.quant.weight_block_size) == (32, 32)


def test_weights_have_the_loader_layout(cfg, weights):
    specs = _all_specs(cfg)  # target tensors + DSpark mtp.{0,1,2}
    assert set(weights) == set(specs) and set(expected_tensors(cfg)) <= set(specs)
    for name, spec in specs.items():
        t = weights[name]
        assert tuple(t.shape) == spec.shape and t.dtype in spec.dtypes, name
        if t.dtype == torch.float8_e8m0fnu:  # UE8M0 scales: powers of two, never the NaN byte 255
            assert int(t.view(torch.uint8).max()) < 255, name
    e = "layers.3.ffn.experts.5.w2.weight"  # generated on access, identical each time
    assert torch.equal(weights[e], weights[e])


def test_decode_step_runs(cfg, weights, monkeypatch):
    monkeypatch.setattr(sweep, "DEV", "cpu")
    model = sweep.make_model(cfg, weights, "reference")
    ex, slices, ids = sweep.setup_step(model, cfg, batch=2, ctx=40, new_tokens=1)
    with torch.inference_mode():
        logits = model.compute_logits(ex.run(ids, slices))
    assert logits.shape == (2, cfg.vocab_size) and bool(torch.isfinite(logits).all())


def test_pipelined_timing_chains_greedy_steps(cfg, weights, monkeypatch):
    """``time_pipelined`` feeds each step the previous step's argmax (device ids): its timing runs, and the
    chain it times is the greedy chain of synchronous steps (checked here with the same step function)."""
    from benchmarks import sweep_timing

    monkeypatch.setattr(sweep, "DEV", "cpu")
    model = sweep.make_model(cfg, weights, "reference")
    ex, slices, ids = sweep.setup_step(model, cfg, batch=2, ctx=40, new_tokens=1)
    seen = []
    real_run = ex.run
    monkeypatch.setattr(ex, "run", lambda step_ids, sl: seen.append(step_ids.clone()) or real_run(step_ids, sl))
    m = sweep_timing.time_pipelined(model, ex, slices, ids, steps=2)
    assert m["pipelined_ms"] > 0 and m["pipelined_ms_min"] <= m["pipelined_ms"] and m["pipelined_steps"] == 2
    assert len(seen) == 2 + 3 * 2 and torch.equal(seen[0], ids)
    with torch.inference_mode():  # step 2 of the first chain took step 1's greedy samples
        assert torch.equal(seen[1], model.compute_logits(real_run(seen[0], slices)).argmax(dim=-1))


def test_byte_accounting_counts_each_tensor_once(cfg):
    specs = expected_tensors(cfg)
    dense_step = tensor_bytes_read(cfg, 10 ** 9)  # every expert, embedding row and Engram row touched
    assert set(dense_step) == set(specs)
    for name, spec in specs.items():
        assert dense_step[name] == spec_bytes(spec), name
    wb = sweep_slice.weight_bytes(None, cfg, 10 ** 9)
    assert wb["dense"] + wb["experts"] == sum(spec_bytes(s) for s in specs.values())
    one = sweep_slice.weight_bytes(None, cfg, 1)  # one token: top_k experts per layer
    expert = sum(spec_bytes(s) for n, s in specs.items() if n.startswith("layers.0.ffn.experts.0."))
    assert one["experts"] == pytest.approx(cfg.num_hidden_layers * cfg.num_experts_per_tok * expert)
    assert sweep_slice.kv_bytes(cfg, 2, 40) == 2 * sweep_slice.kv_bytes(cfg, 1, 40) > 0
    assert sweep_slice.prefill_flops(None, cfg, 64) > 2 * 64 * sum(
        s.shape[0] * s.shape[1] for n, s in specs.items() if n.endswith("attn.wq_b.weight"))


def test_saved_checkpoint_loads(cfg, weights, tmp_path):
    from deepinfer_core import LLM, SamplingParams

    d = save_checkpoint(weights, tmp_path / "slice", shard_bytes=2 << 20)  # several shards + index
    assert (d / "model.safetensors.index.json").is_file() and (d / "tokenizer.json").is_file()
    llm = LLM(str(d), dtype="float32", max_model_len=128, kv_cache_memory_bytes=16 << 20,
              speculative_config={"num_speculative_tokens": 2})  # loads the mtp.* DSpark stages too
    out = llm.generate(["Hello"], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True), use_tqdm=False)
    assert out[0].error is None and len(out[0].outputs[0].token_ids) == 3
    assert llm.llm_engine.spec_decode_stats()["num_drafts"] >= 1


def test_sweep_executor_gets_the_engines_step_kernels(cfg, weights, monkeypatch):
    """The sweep's executor takes the step-metadata kernels the engine resolves (``LLMEngine`` hands them to its
    ``PagedExecutor``): the nvidia platform's Triton ``kv.*_slots`` for a kernel provider, core's torch ops (None)
    for the references. Before the sixteenth pass the sweep timed the torch ops in every row. (The platform
    refuses to build without a GPU; resolving needs only its class attributes, so its __init__ is skipped.)"""
    pytest.importorskip("triton")
    from deepinfer_nvidia.platform import NvidiaPlatform

    monkeypatch.delenv("DEEPINFER_KERNELS", raising=False)  # the suite may force references
    monkeypatch.setattr(NvidiaPlatform, "__init__", lambda self: None)
    monkeypatch.setattr(sweep, "DEV", "cpu")
    kernels = sweep.step_kernels("triton")
    assert set(kernels) == {"kv.sliding_slots", "kv.compressed_slots"}
    for op, fn in kernels.items():
        assert fn.__module__ == "deepinfer_nvidia.kernels.triton_kv", (op, fn.__module__)
    assert sweep.step_kernels("reference") is None
    model = sweep.make_model(cfg, weights, "reference")
    ex, _, _ = sweep.setup_step(model, cfg, 1, 0, 4, kernels)
    assert ex.kernels is kernels


def test_sweep_graph_runner_compiles_with_the_models_platform(cfg, weights, monkeypatch):
    """With ``DEEPINFER_NV_COMPILE=1`` the sweep's graph runner compiles: it comes from the same platform instance
    that resolved the kernels (a fresh instance has resolved nothing, so it never compiled: H200, pass29a)."""
    pytest.importorskip("triton")
    from deepinfer_nvidia.platform import NvidiaPlatform

    monkeypatch.delenv("DEEPINFER_KERNELS", raising=False)
    monkeypatch.delenv("DEEPINFER_BATCH_INVARIANT", raising=False)
    monkeypatch.setenv("DEEPINFER_NV_COMPILE", "1")
    monkeypatch.setattr(NvidiaPlatform, "__init__", lambda self: None)
    monkeypatch.setattr(sweep, "DEV", "cpu")
    monkeypatch.setattr(sweep, "_PLATFORMS", {})
    kernels = sweep.step_kernels("triton")
    assert sweep.nvidia_platform("triton") is sweep.nvidia_platform("triton")
    model = sweep.make_model(cfg, weights, "reference")
    ex, _, _ = sweep.setup_step(model, cfg, 1, 0, 4, kernels)
    assert sweep.graph_steps(ex, 1, 8).graphed.compiles
    monkeypatch.setattr(sweep, "_PLATFORMS", {})  # a fresh platform: nothing resolved through it
    assert not sweep.graph_steps(ex, 1, 8).graphed.compiles
