"""Tiny native V4.1 checkpoints: writer, layout, and loader errors that name the problem.

A 512-token vocabulary keeps these fast (the real tokenizer is still copied: Engram's token
map comes from it; ids below 512 are all the model ever sees here).
"""
from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from deepinfer_core.kernels.ops.quant import dequant_fp8_block, dequant_mxfp4
from deepinfer_core.loader import CheckpointError
from deepinfer_models.deepseek_v41.checkpoint_writer import tiny_v41_config, write_tiny_v41_checkpoint
from deepinfer_models.deepseek_v41.config import DeepseekV41Config, V41ConfigError
from deepinfer_models.deepseek_v41.loading import load_deepseek_v41
from deepinfer_models.deepseek_v41.weights import expected_tensors, mtp_layer_tensors

SMALL = dict(vocab_size=512)


def _write(tmp_path, name="ckpt", quant="fp4", seed=0, topology="flash", **kw):
    return write_tiny_v41_checkpoint(tmp_path / name, tiny_v41_config(topology, **SMALL), quant=quant, seed=seed, **kw)


@pytest.fixture(scope="module")
def fp4_dir(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("v41ck"), quant="fp4")


def _copy(src, tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(src, dst)
    return dst


def _edit(path, fn):
    f = path / "model.safetensors"
    t = load_file(str(f))
    fn(t)
    save_file(t, str(f), metadata={"format": "pt"})


def _logits(model, ids):
    from tests.models.v41_helpers import full_logits

    return full_logits(model, ids)


def test_config_json_is_the_nested_v41_layout(fp4_dir):
    raw = json.loads((fp4_dir / "config.json").read_text())
    assert raw["architectures"] == ["DeepseekV41ForCausalLM"] and raw["model_type"] == "deepseek_v41"
    assert raw["quantization_config"] == {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                                          "activation_scheme": "dynamic", "weight_block_size": [32, 32],
                                          "expert_dtype": "fp4"}
    text = raw["text_config"]
    assert text["model_type"] == "deepseek_v41_text" and text["engram_compressed_vocab_size"] == 99092
    assert text["kv_source_layer_ids"] == [2, 6] and text["candidate_source_layer_id"] == 6
    assert "vision_config" in raw and (fp4_dir / "tokenizer.json").is_file()


def test_writer_is_deterministic(tmp_path, fp4_dir):
    again = _write(tmp_path, "again", quant="fp4")
    other = _write(tmp_path, "other", quant="fp4", seed=1)
    for f in ("config.json", "model.safetensors"):
        assert (again / f).read_bytes() == (fp4_dir / f).read_bytes(), f
    assert (other / "model.safetensors").read_bytes() != (fp4_dir / "model.safetensors").read_bytes()


@pytest.mark.parametrize("quant", ["none", "fp8", "fp4"])
def test_layout_of_every_quant_variant(tmp_path, quant):
    path = _write(tmp_path, quant=quant)
    cfg = DeepseekV41Config.from_pretrained(path)
    stored = load_file(str(path / "model.safetensors"))
    specs = expected_tensors(cfg)
    mtp = {n for n in stored if n.startswith("mtp.")}
    assert set(stored) - mtp == set(specs)
    assert set(mtp_layer_tensors(cfg)) < mtp and {"mtp.0.main_proj.weight", "mtp.2.norm.weight"} < mtp
    for name, spec in specs.items():
        assert tuple(stored[name].shape) == spec.shape and stored[name].dtype in spec.dtypes, name
    wq_a, wk = stored["layers.2.attn.wq_a.weight"], "layers.2.attn.indexer.wk.weight"
    assert stored[wk].dtype == torch.bfloat16 and "layers.4.attn.indexer.wk.weight" not in stored
    assert "layers.3.attn.compressor.wkv.weight" not in stored and "layers.6.attn.compressor.wgate.weight" not in stored
    assert stored["layers.2.attn.compressor.wgate.weight"].dtype == torch.bfloat16
    assert "layers.0.ffn.gate.tid2eid" not in stored and "hc_head_fn" not in stored
    if quant == "none":
        assert wq_a.dtype == torch.bfloat16 and "layers.1.engram.embed.scale" not in stored
        return
    assert wq_a.dtype == torch.float8_e4m3fn
    assert stored["layers.2.attn.wq_a.scale"].shape == (1, 2) and stored["layers.2.attn.wq_a.scale"].dtype == \
        torch.float8_e8m0fnu  # [ceil(32/32), ceil(64/32)]
    w1 = stored["layers.0.ffn.experts.3.w1.weight"]
    assert w1.dtype == (torch.uint8 if quant == "fp4" else torch.float8_e4m3fn)
    table = stored["layers.4.engram.embed.weight"]
    assert table.dtype == torch.float8_e4m3fn and stored["layers.4.engram.embed.scale"].shape == (table.shape[0], 1)


def test_quantised_weights_match_the_unquantised_checkpoint(tmp_path, fp4_dir):
    plain = load_file(str(_write(tmp_path, "plain", quant="none") / "model.safetensors"))
    fp4 = load_file(str(fp4_dir / "model.safetensors"))
    name = "layers.6.attn.wo_b"
    ref = plain[f"{name}.weight"].float()
    deq = dequant_fp8_block(fp4[f"{name}.weight"], fp4[f"{name}.scale"], (32, 32))
    assert (deq - ref).abs().max() <= ref.abs().max() / 16
    e = "layers.3.ffn.experts.5.w2"
    deq = dequant_mxfp4(fp4[f"{e}.weight"], fp4[f"{e}.scale"])
    assert (deq - plain[f"{e}.weight"].float()).abs().max() <= plain[f"{e}.weight"].float().abs().max() / 4
    t = "layers.1.engram.embed"
    deq = fp4[f"{t}.weight"].float() * torch.exp2(fp4[f"{t}.scale"].view(torch.uint8).float() - 127)
    assert (deq - plain[f"{t}.weight"].float()).abs().max() <= plain[f"{t}.weight"].float().abs().max() / 16


def test_sharded_checkpoint_loads_like_the_single_file(tmp_path, fp4_dir):
    sharded = _write(tmp_path, "sharded", quant="fp4", shard_max_bytes=256 * 1024)
    assert len(list(sharded.glob("model-*-of-*.safetensors"))) > 2
    ids = list(range(3, 60))
    a = _logits(load_deepseek_v41(fp4_dir, dtype=torch.float32), ids)
    b = _logits(load_deepseek_v41(sharded, dtype=torch.float32, engram_on_host=True), ids)
    assert torch.equal(a, b)


# -- loader errors ----------------------------------------------------------------------------
def test_missing_engram_table(tmp_path, fp4_dir):
    path = _copy(fp4_dir, tmp_path)
    _edit(path, lambda t: t.pop("layers.4.engram.embed.weight"))
    with pytest.raises(CheckpointError, match=r"Engram table 'layers\.4\.engram\.embed\.weight' is missing"):
        load_deepseek_v41(path, dtype=torch.float32)


def test_engram_table_with_wrong_rows(tmp_path, fp4_dir):
    path = _copy(fp4_dir, tmp_path)
    _edit(path, lambda t: t.update({"layers.1.engram.embed.scale": t["layers.1.engram.embed.scale"][:-1].clone()}))
    with pytest.raises(CheckpointError, match=r"Engram table 'layers\.1\.engram\.embed\.scale'.*expected shape"):
        load_deepseek_v41(path, dtype=torch.float32)


def test_wrong_expert_packing(tmp_path, fp4_dir):
    path = _copy(fp4_dir, tmp_path)
    name = "layers.2.ffn.experts.1.w3.weight"

    def unpack(t):  # one e2m1 code per byte instead of two
        w = t[name]
        t[name] = torch.stack([w & 15, w >> 4], dim=-1).flatten(1).contiguous()

    _edit(path, unpack)
    with pytest.raises(CheckpointError, match=r"expert weight 'layers\.2\.ffn\.experts\.1\.w3\.weight'.*not packed "
                                              r"MXFP4: expected uint8/int8 \[32, 32\].*got U8 \[32, 64\]"):
        load_deepseek_v41(path, dtype=torch.float32)


def test_missing_index_key_projection_on_an_owner_layer(tmp_path, fp4_dir):
    path = _copy(fp4_dir, tmp_path)
    _edit(path, lambda t: t.pop("layers.6.attn.indexer.wk.weight"))
    with pytest.raises(CheckpointError, match=r"missing.*'layers\.6\.attn\.indexer\.wk\.weight'"):
        load_deepseek_v41(path, dtype=torch.float32)


def test_dspark_tensors_are_validated(tmp_path, fp4_dir):
    path = _copy(fp4_dir, tmp_path)
    _edit(path, lambda t: t.pop("mtp.1.attn.wkv.weight"))
    with pytest.raises(CheckpointError, match=r"DSpark tensor 'mtp\.1\.attn\.wkv\.weight' is missing"):
        load_deepseek_v41(path, dtype=torch.float32)
    path = _copy(fp4_dir, tmp_path / "b")
    _edit(path, lambda t: t.update({"mtp.1.attn.wkv.weight": t["mtp.1.attn.wkv.weight"][:8].clone()}))
    with pytest.raises(CheckpointError, match=r"DSpark tensor 'mtp\.1\.attn\.wkv\.weight'.*expected shape"):
        load_deepseek_v41(path, dtype=torch.float32)
    path = _copy(fp4_dir, tmp_path / "c")
    _edit(path, lambda t: t.update({"mtp.3.norm.weight": t["mtp.2.norm.weight"].clone()}))
    with pytest.raises(CheckpointError, match=r"unexpected DSpark tensor 'mtp\.3\.norm\.weight'"):
        load_deepseek_v41(path, dtype=torch.float32)
    path = _copy(fp4_dir, tmp_path / "d")
    _edit(path, lambda t: t.update({"mtp.1.norm.weight": t["mtp.2.norm.weight"].clone()}))
    with pytest.raises(CheckpointError, match=r"DSpark tensor 'norm\.weight' is stored twice"):
        load_deepseek_v41(path, dtype=torch.float32)


def test_target_only_checkpoint_and_vision_tensors_load(tmp_path, fp4_dir, caplog):
    path = _copy(fp4_dir, tmp_path)

    def edit(t):
        for n in [n for n in t if n.startswith("mtp.")]:
            t.pop(n)
        t["vision.blocks.0.attn.qkv.weight"] = torch.zeros(4, 4, dtype=torch.bfloat16)
        t["aligner.proj.weight"] = torch.zeros(2, 2, dtype=torch.bfloat16)
        t["image_newline"] = torch.zeros(4, dtype=torch.bfloat16)
        t["layers.3.ffn.gate.bias_vl"] = torch.zeros(8)  # VL router bias: accepted, unused

    _edit(path, edit)
    with caplog.at_level(logging.INFO, logger="deepinfer_models.deepseek_v41.loading"):
        model = load_deepseek_v41(path, dtype=torch.float32)
    lines = [r.getMessage() for r in caplog.records if "vision tensors" in r.getMessage()]
    assert lines == ["skipping 3 vision tensors (vision., aligner., image_): DeepInfer serves the text model only"]
    assert any("no DSpark" in r.getMessage() for r in caplog.records)
    ids = list(range(3, 40))
    assert torch.equal(_logits(model, ids), _logits(load_deepseek_v41(fp4_dir, dtype=torch.float32), ids))


def test_compressed_vocab_mismatch_is_named(tmp_path, fp4_dir):
    path = _copy(fp4_dir, tmp_path)
    raw = json.loads((path / "config.json").read_text())
    raw["text_config"]["engram_compressed_vocab_size"] = 99000
    (path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match=r"normalises to 99092 distinct tokens but config.json field "
                                              r"'engram_compressed_vocab_size' is 99000"):
        load_deepseek_v41(path, dtype=torch.float32)


def test_malformed_config_json_fails_before_any_tensor_is_read(tmp_path, fp4_dir):
    path = _copy(fp4_dir, tmp_path)
    raw = json.loads((path / "config.json").read_text())
    raw["quantization_config"]["weight_block_size"] = [128, 128]
    (path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(V41ConfigError, match=r"weight_block_size.*32x32"):
        load_deepseek_v41(path, dtype=torch.float32)
    raw["quantization_config"]["weight_block_size"] = [32, 32]
    raw["text_config"]["kv_source_layer_ids"] = [6]
    (path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(V41ConfigError, match=r"compressed layer 2 \(ratio 2\) has no kv source at or below it"):
        load_deepseek_v41(path, dtype=torch.float32)


def test_writer_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="quant must be one of"):
        write_tiny_v41_checkpoint(tmp_path / "x", tiny_v41_config("flash", **SMALL), quant="int4")
    with pytest.raises(ValueError, match="topology must be one of"):
        tiny_v41_config("pro")
