"""Tiny native V4 checkpoints: writer, layout (expected_tensors), loader errors, HF conversion."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from deepinfer_core.kernels.ops.quant import dequant_fp8_block, dequant_mxfp4
from deepinfer_core.loader import CheckpointError, TensorSpec, load_checkpoint
from deepinfer_models.deepseek_v4.config import DeepseekV4Config
from deepinfer_models.testing import SKIP_PREFIXES, expected_tensors, tiny_v4_config, write_tiny_v4_checkpoint

SMALL = dict(vocab_size=512)  # loader tests do not need the real vocabulary


def _small(tmp_path, name="ckpt", quant="none", **kw):
    return write_tiny_v4_checkpoint(tmp_path / name, tiny_v4_config(**SMALL), quant=quant, tokenizer=False, **kw)


def _stored(model_dir) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, safetensors dtype) straight from the file headers."""
    out = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as h:
            for name in h.keys():
                assert name not in out, f"{name} stored twice"
                sl = h.get_slice(name)
                out[name] = (tuple(sl.get_shape()), sl.get_dtype())
    return out


def test_writer_is_deterministic(tmp_path):
    a, b = _small(tmp_path, "a", quant="fp4"), _small(tmp_path, "b", quant="fp4")
    c = write_tiny_v4_checkpoint(tmp_path / "c", tiny_v4_config(**SMALL), quant="fp4", seed=1, tokenizer=False)
    for f in ("config.json", "model.safetensors"):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()


@pytest.mark.parametrize("quant", ["none", "fp8", "fp4"])
def test_expected_tensors_describe_every_written_tensor(tmp_path, quant):
    path = _small(tmp_path, quant=quant)
    cfg = DeepseekV4Config.from_pretrained(path)
    assert cfg.quant.quantized == (quant != "none")
    specs = expected_tensors(cfg)
    stored = _stored(path)
    assert set(stored) == set(specs)
    tensors = load_checkpoint(path, specs, progress=False)  # shapes and dtypes are checked by the loader
    assert set(tensors) == set(specs)
    roles = {spec.role for spec in specs.values()}
    if quant == "none":
        assert "fp8_weight" not in roles and "mxfp4_weight" not in roles
    else:
        wq_a = tensors["layers.1.attn.wq_a.weight"]
        assert wq_a.dtype == torch.float8_e4m3fn
        scale_dtype = torch.float8_e8m0fnu if quant == "fp4" else torch.float32
        assert tensors["layers.1.attn.wq_a.scale"].dtype == scale_dtype
        assert tensors["layers.1.ffn.shared_experts.w2.weight"].dtype == torch.float8_e4m3fn
        w1 = tensors["layers.1.ffn.experts.3.w1.weight"]
        assert w1.dtype == (torch.uint8 if quant == "fp4" else torch.float8_e4m3fn)
        # compressor / indexer scorer / router stay bf16 in quantised checkpoints
        assert tensors["layers.1.attn.compressor.wkv.weight"].dtype == torch.bfloat16
        assert tensors["layers.1.attn.indexer.weights_proj.weight"].dtype == torch.bfloat16
        assert tensors["layers.1.attn.indexer.wq_b.weight"].dtype == torch.float8_e4m3fn
    # layer kinds: ratio 4 has compressor + indexer, ratio 128 only a compressor, hash layer has tid2eid
    assert specs["layers.1.attn.compressor.ape"].shape == (4, 2 * cfg.head_dim)
    assert specs["layers.2.attn.compressor.ape"].shape == (128, cfg.head_dim)
    assert "layers.2.attn.indexer.wq_b.weight" not in specs and "layers.0.attn.compressor.ape" not in specs
    assert "layers.0.ffn.gate.tid2eid" in specs and "layers.0.ffn.gate.bias" not in specs
    assert "layers.1.ffn.gate.bias" in specs and "layers.1.ffn.gate.tid2eid" not in specs


def test_quantised_weights_match_the_unquantised_checkpoint(tmp_path):
    plain = load_file(str(_small(tmp_path, "none") / "model.safetensors"))
    fp8 = load_file(str(_small(tmp_path, "fp8", quant="fp8") / "model.safetensors"))
    fp4 = load_file(str(_small(tmp_path, "fp4", quant="fp4") / "model.safetensors"))
    name = "layers.3.attn.wo_a"
    ref = plain[f"{name}.weight"].float()
    deq = dequant_fp8_block(fp8[f"{name}.weight"], fp8[f"{name}.scale"], (128, 128))
    assert (deq - ref).abs().max() <= ref.abs().max() / 16
    e = "layers.2.ffn.experts.5.w2"
    ref = plain[f"{e}.weight"].float()
    deq = dequant_mxfp4(fp4[f"{e}.weight"], fp4[f"{e}.scale"])
    assert (deq - ref).abs().max() <= ref.abs().max() / 4
    assert torch.equal(plain["layers.0.ffn.gate.tid2eid"], fp4["layers.0.ffn.gate.tid2eid"])


def test_parameters_are_non_trivial(tmp_path):
    t = load_file(str(_small(tmp_path) / "model.safetensors"))
    for name, v in t.items():
        if v.is_floating_point():
            f = v.float()
            if f.numel() > 1:
                assert f.std() > 1e-3, name
            assert not ((f == 0).all() or (f == 1).all()), name
    norm = t["layers.1.attn.kv_norm.weight"].float()
    assert 0.5 < norm.mean() < 1.5
    tid = t["layers.0.ffn.gate.tid2eid"]
    assert tid.shape == (512, 2) and (tid[:, 0] != tid[:, 1]).all() and tid.max() < 8


def test_sharded_checkpoint_loads_like_the_single_file(tmp_path):
    single = _small(tmp_path, "single", quant="fp8")
    sharded = _small(tmp_path, "sharded", quant="fp8", shard_max_bytes=64 * 1024)
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and not (sharded / "model.safetensors").exists()
    cfg = DeepseekV4Config.from_pretrained(sharded)
    specs = expected_tensors(cfg)
    assert set(_stored(sharded)) == set(specs) == set(index["weight_map"])
    a = load_checkpoint(single, specs, progress=False)
    b = load_checkpoint(sharded, specs, progress=False)
    for name in specs:
        assert torch.equal(a[name].view(torch.uint8), b[name].view(torch.uint8)), name


# -- loader errors ------------------------------------------------------------------------------
def _rewrite(path, edit):
    f = path / "model.safetensors"
    tensors = load_file(str(f))
    edit(tensors)
    save_file(tensors, str(f), metadata={"format": "pt"})
    return expected_tensors(DeepseekV4Config.from_pretrained(path))


def test_loader_missing_tensor(tmp_path):
    path = _small(tmp_path)
    specs = _rewrite(path, lambda t: t.pop("layers.2.attn.compressor.ape"))
    with pytest.raises(CheckpointError, match=r"missing.*'layers\.2\.attn\.compressor\.ape'") as exc:
        load_checkpoint(path, specs, progress=False)
    assert "model.safetensors" in str(exc.value)


def test_loader_unexpected_tensor_and_skip_prefixes(tmp_path):
    path = _small(tmp_path)
    specs = _rewrite(path, lambda t: t.update({"layers.0.attn.bogus.weight": torch.zeros(2),
                                                "mtp.0.attn.wq_a.weight": torch.zeros(2)}))
    with pytest.raises(CheckpointError, match=r"unexpected.*'layers\.0\.attn\.bogus\.weight' \(in model\.safetensors\)"):
        load_checkpoint(path, specs, skip_prefixes=SKIP_PREFIXES, progress=False)
    with pytest.raises(CheckpointError, match=r"2 unexpected"):
        load_checkpoint(path, specs, progress=False)
    _rewrite(path, lambda t: t.pop("layers.0.attn.bogus.weight"))
    out = load_checkpoint(path, specs, skip_prefixes=SKIP_PREFIXES, progress=False)
    assert "mtp.0.attn.wq_a.weight" not in out and set(out) == set(specs)


def test_loader_wrong_shape(tmp_path):
    path = _small(tmp_path)
    specs = _rewrite(path, lambda t: t.update({"layers.1.attn.wkv.weight": torch.zeros(63, 64, dtype=torch.bfloat16)}))
    with pytest.raises(CheckpointError, match=r"'layers\.1\.attn\.wkv\.weight' in .*model\.safetensors: "
                                              r"expected shape \[64, 64\], got \[63, 64\]"):
        load_checkpoint(path, specs, progress=False)


def test_loader_wrong_dtype(tmp_path):
    path = _small(tmp_path, quant="fp4")
    specs = _rewrite(path, lambda t: t.update(
        {"layers.3.attn.wq_b.scale": t["layers.3.attn.wq_b.scale"].float()}))
    with pytest.raises(CheckpointError, match=r"'layers\.3\.attn\.wq_b\.scale' in .*model\.safetensors: "
                                              r"expected dtype float8_e8m0fnu, got float32"):
        load_checkpoint(path, specs, progress=False)


def test_loader_truncated_file(tmp_path):
    path = _small(tmp_path)
    specs = expected_tensors(DeepseekV4Config.from_pretrained(path))
    f = path / "model.safetensors"
    with open(f, "r+b") as fh:
        fh.truncate(f.stat().st_size // 2)
    with pytest.raises(CheckpointError, match=r"cannot read safetensors file .*model\.safetensors"):
        load_checkpoint(path, specs, progress=False)


def test_loader_index_errors(tmp_path):
    path = _small(tmp_path, shard_max_bytes=256 * 1024)
    specs = expected_tensors(DeepseekV4Config.from_pretrained(path))
    index_file = path / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    name, shard = next(iter(index["weight_map"].items()))
    # a tensor the index lists under a shard that does not hold it
    other = next(s for s in index["weight_map"].values() if s != shard)
    index["weight_map"][name] = other
    index_file.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=rf"'{name}' is listed in .* for {other}"):
        load_checkpoint(path, specs, progress=False)
    # a shard that does not exist
    index["weight_map"][name] = shard
    index_file.write_text(json.dumps(index))
    shutil.move(path / shard, tmp_path / "moved")
    with pytest.raises(CheckpointError, match=rf"to shard '{shard}', which does not exist"):
        load_checkpoint(path, specs, progress=False)
    shutil.move(tmp_path / "moved", path / shard)
    assert set(load_checkpoint(path, specs, progress=False)) == set(specs)


def test_loader_no_checkpoint_and_bad_spec(tmp_path):
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        load_checkpoint(tmp_path, {}, progress=False)
    with pytest.raises(TypeError, match="dtypes"):
        TensorSpec((2,), ("bf16",))


# -- HF oracle conversion -------------------------------------------------------------------------
def test_hf_config_matches_hfs_own_reading_of_the_native_config(tmp_path):
    from transformers import DeepseekV4Config as HFConfig

    from tests.oracle.hf_v4 import hf_config_from_native

    cfg = tiny_v4_config()
    ours = hf_config_from_native(cfg)
    native = {k: v for k, v in cfg.to_dict().items() if k not in ("architectures", "torch_dtype", "model_type")}
    theirs = HFConfig(**native)  # HF folds compress_ratios / num_hash_layers / qk_rope_head_dim itself
    assert ours.layer_types == theirs.layer_types
    assert ours.mlp_layer_types == theirs.mlp_layer_types == ["hash_moe", "moe", "moe", "moe"]
    assert ours.partial_rotary_factor == theirs.partial_rotary_factor == 0.25
    assert ours.qk_rope_head_dim == 16
    for kind in ("main", "compress"):
        a, b = ours.rope_parameters[kind], theirs.rope_parameters[kind]
        keys = set(a) | set(b)
        keys.discard("type")  # HF keeps the legacy alias next to rope_type
        assert {k: a.get(k) for k in keys} == {k: b.get(k) for k in keys}, kind
    assert ours.rope_parameters["compress"]["rope_type"] == "yarn"


@pytest.mark.parametrize("quant", ["none", "fp4"])
def test_hf_conversion_loads_and_runs(tmp_path, quant):
    from tests.oracle.hf_v4 import hf_model_from_native

    path = write_tiny_v4_checkpoint(tmp_path / quant, quant=quant)  # real vocab + tokenizer
    assert (path / "tokenizer.json").is_file() and (path / "tokenizer_config.json").is_file()
    model = hf_model_from_native(path)  # raises on any missing / unexpected key
    assert not model.training
    cfg = DeepseekV4Config.from_pretrained(path)
    native = load_checkpoint(path, expected_tensors(cfg), progress=False)
    sd = model.state_dict()
    F = cfg.moe_intermediate_size
    w1 = native["layers.2.ffn.experts.5.w1.weight"]
    w3 = native["layers.2.ffn.experts.5.w3.weight"]
    if quant == "fp4":
        w1 = dequant_mxfp4(w1, native["layers.2.ffn.experts.5.w1.scale"])
        w3 = dequant_mxfp4(w3, native["layers.2.ffn.experts.5.w3.scale"])
    gate_up = sd["model.layers.2.mlp.experts.gate_up_proj"][5]
    assert torch.equal(gate_up[:F], w1.float()) and torch.equal(gate_up[F:], w3.float())
    assert torch.equal(sd["model.layers.1.self_attn.compressor.indexer.position_bias"],
                      native["layers.1.attn.indexer.compressor.ape"])
    assert torch.equal(sd["model.layers.0.mlp.gate.tid2eid"], native["layers.0.ffn.gate.tid2eid"].long())
    ids = torch.tensor([[0, 100, 2000, 30000, 129279, 5, 6, 7, 8, 9, 10, 11]])
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits
    assert logits.shape == (1, 12, cfg.vocab_size) and torch.isfinite(logits).all()
    assert 0.1 < logits.std() < 10  # activations stay O(1)


def test_writer_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="quant must be one of"):
        write_tiny_v4_checkpoint(tmp_path / "x", tiny_v4_config(**SMALL), quant="int4", tokenizer=False)
    with pytest.raises(ValueError, match="divisible by 32"):
        write_tiny_v4_checkpoint(tmp_path / "y", tiny_v4_config(moe_intermediate_size=48, **SMALL), quant="fp4",
                                 tokenizer=False)
    with pytest.raises(ValueError, match="compress_ratios"):
        tiny_v4_config(compress_ratios=(0, 4, 2, 4))
