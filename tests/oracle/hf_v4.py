"""transformers' DeepseekV4ForCausalLM built from one of our native V4 checkpoints.

The oracle for model tests: load the native checkpoint with our loader,
dequantise fp8 / MXFP4 weights to float, rename native -> HF parameter names
(MODEL_SPEC.md 4.2), stack the per-expert weights, and load them into HF's
model with a strict key check. Use its stateless forward (``use_cache=False``)
as the reference: HF's cached decode drifts once a compression window closes
(MODEL_SPEC.md, oracle caveat).
"""
from __future__ import annotations

from pathlib import Path

import torch

from deepinfer_core.kernels.ops.quant import dequant_fp8_block, dequant_mxfp4
from deepinfer_core.loader import load_checkpoint
from deepinfer_models.deepseek_v4.config import DeepseekV4Config
from deepinfer_models.deepseek_v4.weights import SKIP_PREFIXES, expected_tensors

_LAYER_TYPES = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}

# Native sub-path under ``layers.{i}.attn.`` -> HF sub-path under ``model.layers.{i}.self_attn.``.
_ATTN_NAMES = {
    "wq_a.weight": "q_a_proj.weight",
    "q_norm.weight": "q_a_norm.weight",
    "wq_b.weight": "q_b_proj.weight",
    "wkv.weight": "kv_proj.weight",
    "kv_norm.weight": "kv_norm.weight",
    "wo_a.weight": "o_a_proj.weight",
    "wo_b.weight": "o_b_proj.weight",
    "attn_sink": "sinks",
    "compressor.wkv.weight": "compressor.kv_proj.weight",
    "compressor.wgate.weight": "compressor.gate_proj.weight",
    "compressor.ape": "compressor.position_bias",
    "compressor.norm.weight": "compressor.kv_norm.weight",
    # HF nests the lightning indexer (and its own compressor) inside the CSA compressor.
    "indexer.wq_b.weight": "compressor.indexer.q_b_proj.weight",
    "indexer.weights_proj.weight": "compressor.indexer.scorer.weights_proj.weight",
    "indexer.compressor.wkv.weight": "compressor.indexer.kv_proj.weight",
    "indexer.compressor.wgate.weight": "compressor.indexer.gate_proj.weight",
    "indexer.compressor.ape": "compressor.indexer.position_bias",
    "indexer.compressor.norm.weight": "compressor.indexer.kv_norm.weight",
}
# Native sub-path under ``layers.{i}.`` (outside attn/ffn) -> HF.
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "hc_attn_fn": "attn_hc.fn", "hc_attn_base": "attn_hc.base", "hc_attn_scale": "attn_hc.scale",
    "hc_ffn_fn": "ffn_hc.fn", "hc_ffn_base": "ffn_hc.base", "hc_ffn_scale": "ffn_hc.scale",
}
# Native sub-path under ``layers.{i}.ffn.`` -> HF under ``mlp.`` (experts are stacked separately).
_FFN_NAMES = {
    "gate.weight": "gate.weight",
    "gate.bias": "gate.e_score_correction_bias",
    "gate.tid2eid": "gate.tid2eid",
    "shared_experts.w1.weight": "shared_experts.gate_proj.weight",
    "shared_experts.w2.weight": "shared_experts.down_proj.weight",
    "shared_experts.w3.weight": "shared_experts.up_proj.weight",
}
_TOP_NAMES = {
    "embed.weight": "model.embed_tokens.weight",
    "head.weight": "lm_head.weight",
    "norm.weight": "model.norm.weight",
    "hc_head_fn": "model.hc_head.hc_fn",
    "hc_head_base": "model.hc_head.hc_base",
    "hc_head_scale": "model.hc_head.hc_scale",
}


def hf_config_from_native(cfg: DeepseekV4Config):
    """transformers ``DeepseekV4Config`` equivalent to our native config (HF schema)."""
    from transformers import DeepseekV4Config as HFConfig

    if not cfg.norm_topk_prob:
        raise ValueError("HF DeepseekV4 always renormalises the top-k weights; norm_topk_prob=False has no HF twin")
    if cfg.n_shared_experts != 1:
        raise ValueError(f"HF DeepseekV4 has exactly one shared expert of width moe_intermediate_size; "
                         f"n_shared_experts={cfg.n_shared_experts} cannot be converted")
    L = cfg.num_hidden_layers
    prf = cfg.qk_rope_head_dim / cfg.head_dim
    main = {"rope_type": "default", "rope_theta": cfg.rope_theta, "partial_rotary_factor": prf}
    compress = {"rope_type": "default", "rope_theta": cfg.compress_rope_theta, "partial_rotary_factor": prf}
    if cfg.rope_scaling:
        rs = cfg.rope_scaling
        # Compressed layers use YaRN frequencies with no magnitude scaling (attention_factor 1).
        compress = {**compress, "rope_type": "yarn", "factor": rs["factor"],
                    "original_max_position_embeddings": rs["original_max_position_embeddings"],
                    "beta_fast": rs.get("beta_fast", 32), "beta_slow": rs.get("beta_slow", 1),
                    "attention_factor": 1.0}
    return HFConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, moe_intermediate_size=cfg.moe_intermediate_size,
        num_hidden_layers=L, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim, q_lora_rank=cfg.q_lora_rank,
        num_experts_per_tok=cfg.num_experts_per_tok, n_routed_experts=cfg.n_routed_experts,
        n_shared_experts=cfg.n_shared_experts, scoring_func=cfg.scoring_func, norm_topk_prob=cfg.norm_topk_prob,
        routed_scaling_factor=cfg.routed_scaling_factor, max_position_embeddings=cfg.max_position_embeddings,
        rope_theta=cfg.rope_theta, compress_rope_theta=cfg.compress_rope_theta,
        layer_types=[_LAYER_TYPES[cfg.ratio(i)] for i in range(L)],
        mlp_layer_types=["hash_moe" if cfg.is_hash_layer(i) else "moe" for i in range(L)],
        partial_rotary_factor=prf, rope_parameters={"main": main, "compress": compress},
        hc_mult=cfg.hc_mult, hc_sinkhorn_iters=cfg.hc_sinkhorn_iters, hc_eps=cfg.hc_eps,
        swiglu_limit=cfg.swiglu_limit, sliding_window=cfg.sliding_window, o_groups=cfg.o_groups,
        o_lora_rank=cfg.o_lora_rank, index_n_heads=cfg.index_n_heads, index_head_dim=cfg.index_head_dim,
        index_topk=cfg.index_topk, num_nextn_predict_layers=cfg.num_nextn_predict_layers,
        rms_norm_eps=cfg.rms_norm_eps, bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id,
        tie_word_embeddings=False, use_cache=False,
    )


def dequantize_native(tensors: dict[str, torch.Tensor], cfg: DeepseekV4Config) -> dict[str, torch.Tensor]:
    """Native tensors with every quantised linear replaced by its fp32 value (``.scale`` entries dropped)."""
    specs = expected_tensors(cfg)
    block = tuple(cfg.quant.weight_block_size)
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        role = specs[name].role
        if role in ("fp8_scale", "mxfp4_scale"):
            continue
        scale_name = name[: -len("weight")] + "scale"
        if role == "fp8_weight":
            out[name] = dequant_fp8_block(t, tensors[scale_name], block)
        elif role == "mxfp4_weight":
            out[name] = dequant_mxfp4(t, tensors[scale_name])
        else:
            out[name] = t
    return out


def native_to_hf_state_dict(tensors: dict[str, torch.Tensor], cfg: DeepseekV4Config) -> dict[str, torch.Tensor]:
    """Rename dequantised native tensors to HF ``DeepseekV4ForCausalLM`` keys; stack experts.

    ``gate_up_proj [E, 2F, D]`` = ``w1`` rows then ``w3`` rows per expert;
    ``down_proj [E, D, F]`` = ``w2``. Raises ``KeyError`` on any unknown name.
    """
    out: dict[str, torch.Tensor] = {}
    experts: dict[tuple[int, int, str], torch.Tensor] = {}
    for name, t in tensors.items():
        if name in _TOP_NAMES:
            out[_TOP_NAMES[name]] = t
            continue
        parts = name.split(".", 2)
        if parts[0] != "layers" or len(parts) != 3:
            raise KeyError(f"no HF name for native tensor {name!r}")
        i, rest = int(parts[1]), parts[2]
        hf = f"model.layers.{i}."
        if rest in _LAYER_NAMES:
            out[hf + _LAYER_NAMES[rest]] = t
        elif rest.startswith("attn.") and rest[5:] in _ATTN_NAMES:
            out[hf + "self_attn." + _ATTN_NAMES[rest[5:]]] = t
        elif rest.startswith("ffn.") and rest[4:] in _FFN_NAMES:
            out[hf + "mlp." + _FFN_NAMES[rest[4:]]] = t.long() if rest.endswith("tid2eid") else t
        elif rest.startswith("ffn.experts."):
            _, _, e, w, leaf = rest.split(".")
            if leaf != "weight" or w not in ("w1", "w2", "w3"):
                raise KeyError(f"no HF name for native tensor {name!r}")
            experts[(i, int(e), w)] = t
        else:
            raise KeyError(f"no HF name for native tensor {name!r}")
    E = cfg.n_routed_experts
    for i in sorted({k[0] for k in experts}):
        try:
            gate_up = [torch.cat([experts[(i, e, "w1")], experts[(i, e, "w3")]], dim=0) for e in range(E)]
            down = [experts[(i, e, "w2")] for e in range(E)]
        except KeyError as exc:
            raise KeyError(f"layer {i}: expert weight {exc.args[0]} missing") from None
        out[f"model.layers.{i}.mlp.experts.gate_up_proj"] = torch.stack(gate_up)
        out[f"model.layers.{i}.mlp.experts.down_proj"] = torch.stack(down)
    return out


def hf_model_from_native(model_dir: str | Path, dtype: torch.dtype = torch.float32):
    """An eval-mode ``transformers.DeepseekV4ForCausalLM`` holding our native checkpoint's weights.

    ``dtype``: parameter dtype; HF's always-fp32 parts (mHC, norms, sinks, ape,
    router bias) stay fp32 as in ``from_pretrained``. Raises ``RuntimeError``
    if any HF parameter is left unset or any converted tensor has no home.
    """
    from transformers import DeepseekV4ForCausalLM

    cfg = DeepseekV4Config.from_pretrained(model_dir)
    native = load_checkpoint(model_dir, expected_tensors(cfg), skip_prefixes=SKIP_PREFIXES, progress=False)
    state = native_to_hf_state_dict(dequantize_native(native, cfg), cfg)
    hf_cfg = hf_config_from_native(cfg)
    hf_cfg._attn_implementation = "eager"  # the only backend HF's V4 supports
    torch.manual_seed(0)  # HF's random init is overwritten below; keep it reproducible anyway
    model = DeepseekV4ForCausalLM(hf_cfg)
    expected_keys = set(model.state_dict())
    missing = sorted(expected_keys - set(state))
    unexpected = sorted(set(state) - expected_keys)
    if missing or unexpected:
        raise RuntimeError(f"native -> HF conversion mismatch: missing {missing[:10]} ({len(missing)}), "
                           f"unexpected {unexpected[:10]} ({len(unexpected)})")
    model_sd = model.state_dict()
    for key, t in state.items():
        if tuple(t.shape) != tuple(model_sd[key].shape):
            raise RuntimeError(f"native -> HF: {key} has shape {list(t.shape)}, HF expects {list(model_sd[key].shape)}")
    model.load_state_dict(state, strict=True)
    if dtype != torch.float32:
        keep = set(model._keep_in_fp32_modules_strict or [])
        for name, p in model.named_parameters():
            if not keep.intersection(name.split(".")):
                p.data = p.data.to(dtype)
    return model.eval()


__all__ = ["hf_model_from_native", "hf_config_from_native", "native_to_hf_state_dict", "dequantize_native"]
