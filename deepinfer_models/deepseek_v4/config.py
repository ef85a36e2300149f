"""DeepSeek-V4 model config, parsed once from the native ``config.json``.

Field names follow the native checkpoint's ``config.json`` (not the HF schema).
Derived values are properties. ``from_dict`` validates and raises ``ValueError``
naming the offending field.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

V4_RATIOS = (0, 4, 128)


def read_config_json(path: str | Path, error: type[Exception] = ValueError) -> dict[str, Any]:
    """``path/config.json`` as a dict; a missing file or invalid JSON is a clear error naming the file."""
    p = Path(path) / "config.json"
    try:
        return json.loads(p.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"no config.json in {path}") from None
    except json.JSONDecodeError as exc:
        raise error(f"{p} is not valid JSON: {exc}") from None


@dataclass(frozen=True)
class QuantConfig:
    """Checkpoint quantisation. ``fmt`` None means unquantised (bf16/fp32 weights).

    fp8 dense linears: e4m3 weight + per-block scale ``[ceil(N/bn), ceil(K/bn)]``,
    scale dtype fp32 (``scale_fmt`` None) or UE8M0 (``scale_fmt == 'ue8m0'``,
    stored as float8_e8m0fnu). ``expert_dtype`` 'fp8' or 'fp4' (MXFP4 experts).
    """

    fmt: str | None = None  # None | "e4m3"
    weight_block_size: tuple[int, int] = (128, 128)
    scale_fmt: str | None = None  # None (fp32) | "ue8m0"
    expert_dtype: str | None = None  # None | "fp8" | "fp4"

    @property
    def quantized(self) -> bool:
        return self.fmt is not None


@dataclass(frozen=True)
class DeepseekV4Config:
    vocab_size: int = 129280
    hidden_size: int = 4096
    num_hidden_layers: int = 43
    num_attention_heads: int = 64
    num_key_value_heads: int = 1
    head_dim: int = 512
    qk_rope_head_dim: int = 64
    q_lora_rank: int = 1024
    o_groups: int = 8
    o_lora_rank: int = 1024
    sliding_window: int = 128
    compress_ratios: tuple[int, ...] = ()
    compress_rope_theta: float = 160000.0
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # {"type": "yarn", "factor", "original_max_position_embeddings", "beta_fast", "beta_slow"}
    max_position_embeddings: int = 1048576
    rms_norm_eps: float = 1e-6
    n_routed_experts: int = 256
    n_shared_experts: int = 1
    num_experts_per_tok: int = 6
    moe_intermediate_size: int = 2048
    routed_scaling_factor: float = 1.5
    scoring_func: str = "sqrtsoftplus"
    norm_topk_prob: bool = True
    swiglu_limit: float = 10.0
    num_hash_layers: int = 3
    index_n_heads: int = 64
    index_head_dim: int = 128
    index_topk: int = 512
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    num_nextn_predict_layers: int = 1
    bos_token_id: int = 0
    eos_token_id: int = 1
    torch_dtype: str = "bfloat16"
    quant: QuantConfig = field(default_factory=QuantConfig)
    architectures: tuple[str, ...] = ("DeepseekV4ForCausalLM",)

    # -- derived -------------------------------------------------------------
    @property
    def nope_head_dim(self) -> int:
        return self.head_dim - self.qk_rope_head_dim

    def ratio(self, layer: int) -> int:
        """Compress ratio of ``layer`` (0 for layers beyond ``compress_ratios``)."""
        return self.compress_ratios[layer] if layer < len(self.compress_ratios) else 0

    def is_hash_layer(self, layer: int) -> bool:
        return layer < self.num_hash_layers

    # -- parsing -------------------------------------------------------------
    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "DeepseekV4Config":
        """Parse a native V4 ``config.json`` dict; unknown keys are ignored."""
        known = {f.name for f in fields(cls)}
        kw: dict[str, Any] = {k: v for k, v in raw.items() if k in known and k != "quant"}
        q = raw.get("quantization_config") or {}
        expert_dtype = q.get("expert_dtype", raw.get("expert_dtype"))
        if q:
            if q.get("quant_method", "fp8") != "fp8":
                raise ValueError(f"quantization_config.quant_method={q.get('quant_method')!r} is not supported (only 'fp8')")
            bs = q.get("weight_block_size", [128, 128])
            if not (isinstance(bs, (list, tuple)) and len(bs) == 2 and all(isinstance(b, int) and b > 0 for b in bs)):
                raise ValueError(f"quantization_config.weight_block_size must be two positive ints, got {bs!r}")
            kw["quant"] = QuantConfig(fmt=q.get("fmt", "e4m3"), weight_block_size=tuple(bs),
                                      scale_fmt=q.get("scale_fmt"), expert_dtype=expert_dtype or "fp8")
        elif expert_dtype not in (None, "bf16", "bfloat16"):
            raise ValueError(f"expert_dtype={expert_dtype!r} needs a quantization_config")
        for key in ("compress_ratios", "architectures"):
            if key in kw and kw[key] is not None:
                kw[key] = tuple(kw[key])
        cfg = cls(**kw)
        cfg.validate()
        return cfg

    @classmethod
    def from_pretrained(cls, path: str | Path) -> "DeepseekV4Config":
        return cls.from_dict(read_config_json(path))

    def validate(self) -> None:
        def bad(name: str, why: str) -> None:
            raise ValueError(f"config.json field {name!r}: {why}")

        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim",
                     "q_lora_rank", "o_groups", "o_lora_rank", "sliding_window", "n_routed_experts",
                     "num_experts_per_tok", "moe_intermediate_size", "index_n_heads", "index_head_dim",
                     "index_topk", "hc_mult", "hc_sinkhorn_iters"):
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                bad(name, f"must be a positive integer, got {v!r}")
        if self.num_key_value_heads != 1:
            bad("num_key_value_heads", f"DeepSeek-V4 uses one shared KV head, got {self.num_key_value_heads}")
        if not 0 < self.qk_rope_head_dim <= self.head_dim or self.qk_rope_head_dim % 2:
            bad("qk_rope_head_dim", f"must be even and in (0, head_dim], got {self.qk_rope_head_dim}")
        if self.num_attention_heads % self.o_groups:
            bad("o_groups", f"{self.o_groups} does not divide num_attention_heads={self.num_attention_heads}")
        if len(self.compress_ratios) < self.num_hidden_layers:
            bad("compress_ratios", f"has {len(self.compress_ratios)} entries for {self.num_hidden_layers} layers")
        for i, r in enumerate(self.compress_ratios[: self.num_hidden_layers]):
            if r not in V4_RATIOS:
                bad("compress_ratios", f"layer {i} has ratio {r}; DeepSeek-V4 supports {V4_RATIOS}")
        if self.num_experts_per_tok > self.n_routed_experts:
            bad("num_experts_per_tok", f"{self.num_experts_per_tok} > n_routed_experts={self.n_routed_experts}")
        if self.scoring_func != "sqrtsoftplus":
            bad("scoring_func", f"only 'sqrtsoftplus' is supported, got {self.scoring_func!r}")
        if self.num_hash_layers < 0 or self.num_hash_layers > self.num_hidden_layers:
            bad("num_hash_layers", f"must be in [0, num_hidden_layers], got {self.num_hash_layers}")
        if self.rope_scaling is not None and self.rope_scaling.get("type", self.rope_scaling.get("rope_type")) not in ("yarn", None):
            bad("rope_scaling", f"only YaRN is supported, got {self.rope_scaling!r}")
        if self.quant.quantized and self.quant.expert_dtype not in ("fp8", "fp4"):
            bad("expert_dtype", f"must be 'fp8' or 'fp4', got {self.quant.expert_dtype!r}")

    def to_dict(self) -> dict[str, Any]:
        """The native ``config.json`` dict (inverse of ``from_dict``)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "quant":
                continue
            v = getattr(self, f.name)
            out[f.name] = list(v) if isinstance(v, tuple) else v
        out["model_type"] = "deepseek_v4"
        if self.quant.quantized:
            out["quantization_config"] = {"quant_method": "fp8", "fmt": self.quant.fmt,
                                          "weight_block_size": list(self.quant.weight_block_size),
                                          "scale_fmt": self.quant.scale_fmt, "expert_dtype": self.quant.expert_dtype}
            out["expert_dtype"] = self.quant.expert_dtype
        return out
