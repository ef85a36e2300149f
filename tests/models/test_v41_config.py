"""V4.1 config: nested config.json flattening, layer roles, and named errors for malformed configs."""
from __future__ import annotations

import copy
import dataclasses
import json

import pytest

from deepinfer_models.deepseek_v41.config import DeepseekV41Config, V41ConfigError

D = 64


def flash_like(**text_overrides) -> dict:
    """A nested V4.1 config.json dict with the (inferred) Flash topology of MODEL_SPEC.md 1.3, tiny dims."""
    text = dict(
        model_type="deepseek_v41_text", vocab_size=1000, hidden_size=D, num_hidden_layers=40, num_attention_heads=4,
        num_key_value_heads=1, head_dim=64, qk_rope_head_dim=16, q_lora_rank=32, o_groups=2, o_lora_rank=16,
        sliding_window=128, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
        index_n_heads=32, index_head_dim=32, index_topk=512,
        compress_ratios=[0, 0] + [2] * 18 + [1] * 20 + [0, 0, 0],
        kv_source_layer_ids=[2, 20], index_source_layer_ids=[2, 8, 14, 20, 24, 28, 32, 36],
        candidate_source_layer_id=20, candidate_block_size=8, candidate_topk_blocks=2048,
        engram_layer_ids=[1, 14], engram_num_embeddings=[6000, 6000], engram_max_ngram_size=4, engram_n_heads=8,
        engram_head_dim=256, engram_vocab_size=50, engram_compressed_vocab_size=900,
        rope_scaling={"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536},
        hc_pre_from_prev_sublayer=True, q_head_norm=False,
    )
    text.update(text_overrides)
    return {
        "architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41",
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                                "weight_block_size": [32, 32], "expert_dtype": "fp4", "activation_scheme": "dynamic"},
        "text_config": text,
        "vision_config": {"model_type": "deepseek_v41_vision", "num_hidden_layers": 2, "hidden_size": 32},
    }


def test_nested_config_is_flattened_with_text_config_precedence():
    raw = flash_like()
    raw["hidden_size"] = 999  # top-level clash: text_config wins (vLLM's reading)
    cfg = DeepseekV41Config.from_dict(raw)
    assert cfg.hidden_size == D and cfg.num_hidden_layers == 40
    assert cfg.quant.quantized and cfg.quant.weight_block_size == (32, 32) and cfg.quant.expert_dtype == "fp4"
    assert cfg.quant.scale_fmt == "ue8m0"
    assert cfg.rope_scaling["factor"] == 16
    assert cfg.compress_ratios[:3] == (0, 0, 2) and len(cfg.compress_ratios) == 43
    assert cfg.vision_config["num_hidden_layers"] == 2
    # an already-flat text config parses the same way
    flat = dict(raw["text_config"], quantization_config=raw["quantization_config"])
    assert DeepseekV41Config.from_dict(flat) == dataclasses.replace(cfg, vision_config=None)
    # to_dict is the inverse of from_dict
    assert DeepseekV41Config.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_quant_method_deepseek_v4_fp8_is_accepted():
    raw = flash_like()
    raw["quantization_config"]["quant_method"] = "deepseek_v4_fp8"
    assert DeepseekV41Config.from_dict(raw).quant.quantized


def test_flash_layer_roles_follow_the_source_rules():
    cfg = DeepseekV41Config.from_dict(flash_like())
    rows = {  # layer: (ratio, kv_src, idx_src, kv source, index source, owns keys, cand source, cand consumer)
        0: (0, None, None, False, False, False, False, False),
        2: (2, 2, 2, True, True, True, False, False),
        5: (2, 2, 2, False, False, False, False, False),
        8: (2, 2, 8, False, True, False, False, False),
        19: (2, 2, 14, False, False, False, False, False),
        20: (1, 20, 20, True, True, True, True, False),
        23: (1, 20, 20, False, False, False, False, False),
        24: (1, 20, 24, False, True, False, False, True),
        39: (1, 20, 36, False, False, False, False, False),
    }
    for L, want in rows.items():
        got = (cfg.ratio(L), cfg.kv_src(L) if cfg.ratio(L) else None, cfg.idx_src(L) if cfg.ratio(L) else None,
               cfg.is_kv_source(L), cfg.is_index_source(L), cfg.owns_index_keys(L), cfg.is_candidate_source(L),
               cfg.is_candidate_consumer(L))
        assert got == want, f"layer {L}"
    assert cfg.ratio(41) == 0 and not cfg.is_hash_layer(3)
    assert cfg.is_engram_layer(14) and not cfg.is_engram_layer(2)
    assert cfg.engram_n_cols == 24


BAD = [
    ("compressed layer without a kv source",
     dict(compress_ratios=[0, 2, 2] + [1] * 37, kv_source_layer_ids=[2, 20], index_source_layer_ids=[1, 2, 20]),
     r"kv_source_layer_ids.*compressed layer 1 \(ratio 2\) has no kv source at or below it"),
    ("index source out of range", dict(index_source_layer_ids=[2, 8, 40]),
     r"index_source_layer_ids.*index source layer 40 is out of range \[0, 40\)"),
    ("index source not compressed", dict(index_source_layer_ids=[0, 2, 20]),
     r"index source layer 0 is not compressed"),
    ("kv source not compressed", dict(kv_source_layer_ids=[1, 2, 20]), r"kv source layer 1 is not compressed"),
    ("compressed layer without an index source", dict(index_source_layer_ids=[20]),
     r"compressed layer 2 \(ratio 2\) has no index source"),
    ("candidate source not an index source", dict(candidate_source_layer_id=21),
     r"candidate_source_layer_id.*candidate source 21 is not an index source"),
    ("candidate block size missing", dict(candidate_block_size=0), r"candidate_block_size.*positive integer"),
    ("ratio not in 0/1/2", dict(compress_ratios=[0, 0] + [4] * 18 + [1] * 20),
     r"compress_ratios.*layer 2 has ratio 4; DeepSeek-V4.1 supports \(0, 1, 2\)"),
    ("ratio mismatch with the kv source", dict(kv_source_layer_ids=[2], index_source_layer_ids=[2]),
     r"layer 20 has ratio 1 but its kv source 2 has ratio 2"),
    ("index keys with no owner", dict(kv_source_layer_ids=[2, 20], index_source_layer_ids=[3, 20]),
     r"index_source_layer_ids.*compressed layer 2 \(ratio 2\) has no index source"),
    ("index source whose kv source has no keys",
     dict(kv_source_layer_ids=[2, 3, 20], index_source_layer_ids=[2, 4, 20]),
     r"index source layer 4 reads the index keys of its kv source 3, which is not an index source"),
    ("duplicate kv source", dict(kv_source_layer_ids=[2, 2, 20]), r"kv_source_layer_ids.*lists a layer twice"),
    ("hash routing", dict(num_hash_layers=3), r"num_hash_layers.*no hash-routed layers"),
    ("V4 mHC", dict(hc_pre_from_prev_sublayer=False), r"hc_pre_from_prev_sublayer.*must be true"),
    ("Engram table too small", dict(engram_num_embeddings=[6000, 10]), r"Engram layer 14 has 10 rows but"),
    ("Engram rows per layer", dict(engram_num_embeddings=[6000]), r"engram_num_embeddings.*1 entries for 2"),
    ("Engram head dim", dict(engram_head_dim=48), r"engram_head_dim.*multiple of 32"),
    ("Engram layer out of range", dict(engram_layer_ids=[1, 99]), r"Engram layer 99 is out of range"),
    ("bad positive int", dict(hidden_size=0), r"'hidden_size'.*positive integer"),
    ("rope dims", dict(index_head_dim=16), r"index_head_dim.*must exceed qk_rope_head_dim"),
]


@pytest.mark.parametrize("what,override,match", BAD, ids=[b[0] for b in BAD])
def test_malformed_topology_is_rejected_with_a_named_error(what, override, match):
    with pytest.raises(V41ConfigError, match=match):
        DeepseekV41Config.from_dict(flash_like(**override))


@pytest.mark.parametrize("edit,match", [
    (lambda q: q.update(weight_block_size=[128, 128]), r"weight_block_size.*32x32 blocks, got \[128, 128\]"),
    (lambda q: q.update(weight_block_size=[32]), r"weight_block_size.*two positive ints"),
    (lambda q: q.update(quant_method="gptq"), r"quant_method.*'gptq' is not supported"),
    (lambda q: q.update(scale_fmt="fp32"), r"scale_fmt.*'ue8m0'"),
    (lambda q: q.update(expert_dtype="int4"), r"expert_dtype.*'fp8' or 'fp4'"),
])
def test_malformed_quantization_config_is_rejected(edit, match):
    raw = flash_like()
    edit(raw["quantization_config"])
    with pytest.raises(V41ConfigError, match=match):
        DeepseekV41Config.from_dict(raw)


def test_structural_errors():
    raw = flash_like()
    del raw["text_config"]
    with pytest.raises(V41ConfigError, match="text_config.*missing"):
        DeepseekV41Config.from_dict(raw)
    raw = flash_like()
    raw["model_type"] = "deepseek_v3"
    with pytest.raises(V41ConfigError, match="model_type"):
        DeepseekV41Config.from_dict(raw)
    raw = flash_like(kv_source_layer_ids=7)
    with pytest.raises(V41ConfigError, match="kv_source_layer_ids.*must be a list"):
        DeepseekV41Config.from_dict(raw)
    with pytest.raises(V41ConfigError, match="JSON object"):
        DeepseekV41Config.from_dict([1, 2])


def test_draft_layer_ratios_are_tolerated_and_short_ratio_lists_pad_with_zero(caplog):
    cfg = DeepseekV41Config.from_dict(flash_like(compress_ratios=[0, 0] + [2] * 18 + [1] * 20 + [1]))
    assert cfg.ratio(40) == 1 and "draft layers" in caplog.text  # listed, but draft layers run ratio 0
    short = flash_like(num_hidden_layers=4, compress_ratios=[0, 0, 2], kv_source_layer_ids=[2],
                       index_source_layer_ids=[2], candidate_source_layer_id=-1, engram_layer_ids=[1],
                       engram_num_embeddings=[6000])
    cfg = DeepseekV41Config.from_dict(short)
    assert cfg.ratio(3) == 0


def test_engram_num_embeddings_may_be_one_int():
    raw = flash_like(engram_num_embeddings=6000)
    assert DeepseekV41Config.from_dict(copy.deepcopy(raw)).engram_num_embeddings == (6000, 6000)
