"""The full-width slice ``sweep.py`` measures: its config, random native-layout weights built on the
device, and the bytes / FLOPs a step must at least move (for the roofline columns)."""
from __future__ import annotations

import math

import torch

from deepinfer_core.kernels.ops.quant import quant_fp8_block
from deepinfer_models.deepseek_v4.checkpoint_writer import QUANT_PRESETS
from deepinfer_models.deepseek_v4.config import DeepseekV4Config
from deepinfer_models.deepseek_v4.weights import expected_tensors


# -- architecture ------------------------------------------------------------------------------
def v4_slice(layers: int, ratios: list[int], quant: str) -> DeepseekV4Config:
    """V4-Flash widths (the config defaults) with ``layers`` layers."""
    ratios = (ratios * layers)[:layers]
    return DeepseekV4Config(
        num_hidden_layers=layers, compress_ratios=tuple(ratios), num_hash_layers=min(1, layers),
        num_nextn_predict_layers=0, quant=QUANT_PRESETS[quant],
        rope_scaling={"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                      "beta_fast": 32, "beta_slow": 1})


ARCHS = {"v4": v4_slice}


def arch_config(name: str, layers: int, ratios: list[int], quant: str) -> DeepseekV4Config:
    if name not in ARCHS:
        raise SystemExit(f"--arch {name!r}: known architectures {sorted(ARCHS)} (V4.1 lands with its model code; "
                         f"add a slice builder to ARCHS then)")
    return ARCHS[name](layers, ratios, quant)


# -- weights -----------------------------------------------------------------------------------
_E2M1_RMS = math.sqrt(sum(v * v for v in (0, .5, 1, 1.5, 2, 3, 4, 6)) / 8)  # rms of a uniform random code


def build_weights(cfg: DeepseekV4Config, device: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random tensors in the native layout of ``cfg`` (names/shapes/dtypes from ``expected_tensors``), on device.

    Linear weights have std ~ 1/sqrt(fan_in); MXFP4 experts are uniform random codes with one
    power-of-two scale chosen for that std; fp8 linears are quantised from Gaussians.
    """
    specs = expected_tensors(cfg)
    g = torch.Generator(device=device).manual_seed(seed)
    block = tuple(cfg.quant.weight_block_size)
    out: dict[str, torch.Tensor] = {}

    def randn(shape, std=1.0, mean=0.0):
        return torch.randn(shape, generator=g, device=device) * std + mean

    for name, spec in specs.items():
        shape, dt, role = spec.shape, spec.dtypes[0], spec.role
        leaf = name.rsplit(".", 1)[-1]
        stem = name[: -len(".weight")] if name.endswith(".weight") else name
        if role in ("fp8_scale", "mxfp4_scale"):
            continue
        if role == "fp8_weight":
            out[name], out[stem + ".scale"] = quant_fp8_block(randn(shape, shape[1] ** -0.5), block,
                                                              cfg.quant.scale_fmt)
        elif role == "mxfp4_weight":
            n, half = shape
            k = 2 * half
            out[name] = torch.randint(0, 256, shape, generator=g, device=device, dtype=torch.uint8)
            e = round(math.log2(1.0 / (math.sqrt(k) * _E2M1_RMS)))
            out[stem + ".scale"] = torch.full((n, k // 32), e + 127, device=device,
                                              dtype=torch.uint8).view(torch.float8_e8m0fnu)
        elif role == "index":
            out[name] = torch.rand(shape[0], cfg.n_routed_experts, generator=g, device=device).argsort(dim=1)[
                :, : shape[1]].to(dt)
        elif name.endswith("norm.weight"):
            out[name] = randn(shape, 0.1, 1.0).to(dt)
        elif leaf == "attn_sink":
            out[name] = randn(shape).to(dt)
        elif leaf == "ape":
            out[name] = randn(shape, 0.5).to(dt)
        elif leaf.endswith("_fn"):
            out[name] = randn(shape, shape[1] ** -0.5).to(dt)
        elif leaf.endswith("_base"):
            out[name] = randn(shape, 0.5).to(dt)
        elif leaf.endswith("_scale"):
            out[name] = (torch.rand(shape, generator=g, device=device) + 0.5).to(dt)
        elif leaf == "bias":
            out[name] = randn(shape, 0.1).to(dt)
        elif name == "embed.weight":
            out[name] = randn(shape).to(dt)
        else:
            out[name] = randn(shape, shape[1] ** -0.5).to(dt)
    missing = set(specs) - set(out)
    if missing:
        raise AssertionError(f"weights not built: {sorted(missing)[:5]}")
    return out


# -- bytes and flops -------------------------------------------------------------------------------
def expected_distinct(picks: int, experts: int, k: int) -> float:
    """Expected number of distinct experts hit by ``picks`` tokens choosing k of E uniformly."""
    return experts * (1.0 - (1.0 - k / experts) ** picks)


def weight_bytes(w: dict[str, torch.Tensor], cfg: DeepseekV4Config, tokens: int) -> dict[str, float]:
    """Native-layout bytes a step of ``tokens`` tokens must read: dense weights once, touched experts once."""
    per_expert = {}
    dense = 0
    for name, t in w.items():
        nb = t.numel() * t.element_size()
        if ".ffn.experts." in name:
            layer = int(name.split(".")[1])
            if name.split(".")[4] == "0":
                per_expert[layer] = per_expert.get(layer, 0) + nb
        elif name == "embed.weight":
            dense += tokens * t.shape[1] * t.element_size()
        elif name.endswith("gate.tid2eid"):
            dense += tokens * t.shape[1] * t.element_size()
        else:
            dense += nb
    touched = expected_distinct(tokens, cfg.n_routed_experts, cfg.num_experts_per_tok)
    experts = sum(per_expert.values()) * touched
    return {"dense": dense, "experts": experts, "distinct_experts": touched}


def kv_bytes(cfg: DeepseekV4Config, batch: int, ctx: int, elt: int = 2) -> float:
    """KV bytes one decode step reads: window rows, attended compressed rows, all visible index keys."""
    total = 0.0
    p = ctx  # position of the new token
    for i in range(cfg.num_hidden_layers):
        r = cfg.ratio(i)
        total += min(p + 1, cfg.sliding_window) * cfg.head_dim * elt
        vis = (p + 1) // r if r else 0
        if r == 4:
            total += min(vis, cfg.index_topk) * cfg.head_dim * elt + vis * cfg.index_head_dim * elt
        elif r:
            total += vis * cfg.head_dim * elt
    return batch * total


def prefill_flops(w: dict[str, torch.Tensor], cfg: DeepseekV4Config, L: int) -> float:
    """Matmul FLOPs of one L-token prefill (logits of the last token only)."""
    per_tok = 0
    for name, t in w.items():
        if t.dim() != 2 or name.endswith(".scale") or name in ("embed.weight", "head.weight") or "tid2eid" in name:
            continue
        if ".ffn.experts." in name:
            continue
        n, k = t.shape
        if t.dtype == torch.uint8:
            k *= 2
        per_tok += n * k
    per_expert = 3 * cfg.moe_intermediate_size * cfg.hidden_size
    per_tok += cfg.num_hidden_layers * cfg.num_experts_per_tok * per_expert
    fl = 2.0 * L * per_tok + 2.0 * cfg.vocab_size * cfg.hidden_size
    h, d = cfg.num_attention_heads, cfg.head_dim
    for i in range(cfg.num_hidden_layers):
        r = cfg.ratio(i)
        for p in range(0, L, max(1, L // 64)):  # average attended slots over positions
            n = min(p + 1, cfg.sliding_window)
            vis = (p + 1) // r if r else 0
            n += min(vis, cfg.index_topk) if r == 4 else vis
            fl += 4.0 * h * d * n * max(1, L // 64)
            if r == 4:
                fl += 2.0 * cfg.index_n_heads * cfg.index_head_dim * vis * max(1, L // 64)
    return fl
