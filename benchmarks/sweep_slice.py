"""The full-width slice ``sweep.py`` measures: its config, random native-layout weights built on the
device, and the bytes / FLOPs a step must at least move (for the roofline columns).

``--arch v4`` lives here; ``--arch v41`` in ``sweep_slice_v41.py``, reached through the same
functions (``arch_config``, ``build_weights``, ``weight_bytes``, ``kv_bytes``, ``prefill_flops``,
``model_class``), which dispatch on the config type."""
from __future__ import annotations

import dataclasses
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


def v4_tiny(cfg: DeepseekV4Config) -> DeepseekV4Config:
    """``cfg``'s topology at the tiny test checkpoint's widths (smoke runs)."""
    from deepinfer_models.deepseek_v4.checkpoint_writer import tiny_v4_config

    return dataclasses.replace(tiny_v4_config(), num_hidden_layers=cfg.num_hidden_layers,
                               compress_ratios=cfg.compress_ratios, num_hash_layers=cfg.num_hash_layers,
                               quant=cfg.quant, vocab_size=1024, hidden_size=128, moe_intermediate_size=64)


def _v41_slice(layers: int, ratios: list[int], quant: str, tiny: bool = False, engram_vocab: int = 1 << 20):
    return _v41().v41_slice(layers, ratios, quant, tiny=tiny, engram_vocab=engram_vocab)


ARCHS = {"v4": v4_slice, "v41": _v41_slice}
DEFAULT_LAYERS = {"v4": 2, "v41": 8}  # v41: one layer of each kind (sweep_slice_v41.py)


def _v41():
    """The V4.1 slice module (imported on use: it imports this one)."""
    import benchmarks.sweep_slice_v41 as m

    return m


def _is_v41(cfg) -> bool:
    from deepinfer_models.deepseek_v41.config import DeepseekV41Config

    return isinstance(cfg, DeepseekV41Config)


def arch_config(name: str, layers: int | None, ratios: list[int], quant: str, tiny: bool = False,
                engram_vocab: int = 1 << 20):
    """The slice config of ``--arch name`` (``layers`` None: the arch's default); ``tiny``: test widths;
    ``engram_vocab``: V4.1's ``engram_vocab_size`` (Engram table rows ~ 24x it per table)."""
    if name not in ARCHS:
        raise SystemExit(f"--arch {name!r}: known architectures {sorted(ARCHS)}")
    layers = DEFAULT_LAYERS[name] if layers is None else layers
    if name == "v41":
        return ARCHS[name](layers, ratios, quant, tiny=tiny, engram_vocab=engram_vocab)
    cfg = ARCHS[name](layers, ratios, quant)
    return v4_tiny(cfg) if tiny else cfg


def model_class(cfg):
    """The model class of a slice config and the extra constructor keywords it needs."""
    if _is_v41(cfg):
        from deepinfer_models.deepseek_v41.model import DeepseekV41ForCausalLM

        return DeepseekV41ForCausalLM, {"token_map": _v41().token_map(cfg)}
    from deepinfer_models.deepseek_v4.model import DeepseekV4ForCausalLM

    return DeepseekV4ForCausalLM, {}


def describe(cfg) -> dict:
    """Arch-specific config fields for ``sweep.json``."""
    return _v41().describe(cfg) if _is_v41(cfg) else {"hash_layers": cfg.num_hash_layers}


# -- weights -----------------------------------------------------------------------------------
_E2M1_RMS = math.sqrt(sum(v * v for v in (0, .5, 1, 1.5, 2, 3, 4, 6)) / 8)  # rms of a uniform random code


def random_tensor(name: str, spec, cfg, g: torch.Generator, device: str) -> dict[str, torch.Tensor]:
    """One random tensor of role ``spec.role`` in the native layout (an fp8 / MXFP4 weight comes with its
    ``.scale``; scale specs themselves give nothing). Shared by the V4 and V4.1 slices.

    Linear weights have std ~ 1/sqrt(fan_in); MXFP4 experts are uniform random codes with one
    power-of-two (UE8M0) scale chosen for that std; fp8 linears are quantised from Gaussians.
    """
    shape, dt, role = spec.shape, spec.dtypes[0], spec.role
    leaf = name.rsplit(".", 1)[-1]
    stem = name[: -len(".weight")] if name.endswith(".weight") else name
    block = tuple(cfg.quant.weight_block_size)

    def randn(shape, std=1.0, mean=0.0):
        return torch.randn(shape, generator=g, device=device) * std + mean

    if role in ("fp8_scale", "mxfp4_scale"):
        return {}
    if role == "fp8_weight":
        q, s = quant_fp8_block(randn(shape, shape[1] ** -0.5), block, cfg.quant.scale_fmt)
        return {name: q, stem + ".scale": s}
    if role == "mxfp4_weight":
        n, half = shape
        k = 2 * half
        e = round(math.log2(1.0 / (math.sqrt(k) * _E2M1_RMS)))
        return {name: torch.randint(0, 256, shape, generator=g, device=device, dtype=torch.uint8),
                stem + ".scale": torch.full((n, k // 32), e + 127, device=device,
                                            dtype=torch.uint8).view(torch.float8_e8m0fnu)}
    if role == "index":
        return {name: torch.rand(shape[0], cfg.n_routed_experts, generator=g, device=device).argsort(dim=1)[
            :, : shape[1]].to(dt)}
    if name.endswith("norm.weight"):
        t = randn(shape, 0.1, 1.0)
    elif leaf == "attn_sink":
        t = randn(shape)
    elif leaf == "ape":
        t = randn(shape, 0.5)
    elif leaf.endswith("_fn"):
        t = randn(shape, shape[1] ** -0.5)
    elif leaf.endswith("_base"):
        t = randn(shape, 0.5)
    elif leaf.endswith("_scale"):
        t = torch.rand(shape, generator=g, device=device) + 0.5
    elif leaf == "bias":
        t = randn(shape, 0.1)
    elif name == "embed.weight":
        t = randn(shape)
    else:
        t = randn(shape, shape[1] ** -0.5)
    return {name: t.to(dt)}


def build_weights(cfg, device: str, seed: int = 0, draft: bool = False):
    """Random tensors in the native layout of ``cfg`` (names/shapes/dtypes from ``expected_tensors``), on device.

    V4.1 configs go to ``sweep_slice_v41.build_weights`` (``draft``: also the DSpark ``mtp.*`` stages).
    """
    if _is_v41(cfg):
        return _v41().build_weights(cfg, device, seed, draft)
    specs = expected_tensors(cfg)
    g = torch.Generator(device=device).manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name, spec in specs.items():
        out.update(random_tensor(name, spec, cfg, g, device))
    missing = set(specs) - set(out)
    if missing:
        raise AssertionError(f"weights not built: {sorted(missing)[:5]}")
    return out


def native_bytes(w) -> int:
    """Native bytes of a weight mapping (a V4.1 ``SliceWeights`` counts from its specs, generating nothing)."""
    if hasattr(w, "nbytes"):
        return w.nbytes()
    return sum(t.numel() * t.element_size() for t in w.values())


# -- bytes and flops -------------------------------------------------------------------------------
def expected_distinct(picks: int, experts: int, k: int) -> float:
    """Expected number of distinct experts hit by ``picks`` tokens choosing k of E uniformly."""
    return experts * (1.0 - (1.0 - k / experts) ** picks)


def weight_bytes(w: dict[str, torch.Tensor], cfg: DeepseekV4Config, tokens: int) -> dict[str, float]:
    """Native-layout bytes a step of ``tokens`` tokens must read: dense weights once, touched experts once."""
    if _is_v41(cfg):
        return _v41().weight_bytes(w, cfg, tokens)
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
    if _is_v41(cfg):
        return _v41().kv_bytes(cfg, batch, ctx, elt)
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
    if _is_v41(cfg):
        return _v41().prefill_flops(w, cfg, L)
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
