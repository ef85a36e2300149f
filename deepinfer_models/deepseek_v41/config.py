"""DeepSeek-V4.1 model config, flattened once from the nested native ``config.json``.

A V4.1 checkpoint nests the text model under ``text_config`` (plus ``vision_config`` and a
top-level ``quantization_config``, MODEL_SPEC.md 1.1). ``from_dict`` flattens it with vLLM's
precedence (``text_config`` keys win over top-level ones, ``text_config.rope_scaling`` is the
YaRN dict, ``quantization_config.expert_dtype`` is the expert format) and validates the
layer topology: every error is a ``V41ConfigError`` naming the field and the problem.

Layer roles (MODEL_SPEC.md 3.4) are methods: ``kv_src(L)`` / ``idx_src(L)`` are the nearest
kv / index source at or below L; a layer owns a compressor iff it is a kv source, an
indexer iff it is an index source, and the index keys iff it is both.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from deepinfer_models.deepseek_v4.config import QuantConfig, read_config_json

logger = logging.getLogger(__name__)

V41_RATIOS = (0, 1, 2)
V41_BLOCK = (32, 32)
QUANT_METHODS = ("fp8", "deepseek_v4_fp8")
ARCHITECTURE = "DeepseekV41ForCausalLM"


class V41ConfigError(ValueError):
    """A V4.1 ``config.json`` is malformed or describes an impossible layer topology."""


def _bad(name: str, why: str) -> None:
    raise V41ConfigError(f"config.json field {name!r}: {why}")


@dataclass(frozen=True)
class DeepseekV41Config:
    # -- backbone (MODEL_SPEC.md 1.2; defaults are the V4.1-Flash values) --------------
    vocab_size: int = 129280
    hidden_size: int = 5120
    num_hidden_layers: int = 40
    num_attention_heads: int = 64
    num_key_value_heads: int = 1
    head_dim: int = 512
    qk_rope_head_dim: int = 64
    q_lora_rank: int = 1280
    o_groups: int = 8
    o_lora_rank: int = 1024
    sliding_window: int = 128
    max_position_embeddings: int = 1048576
    rope_theta: float = 10000.0
    compress_rope_theta: float = 160000.0
    rope_scaling: dict | None = None
    rms_norm_eps: float = 1e-6
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    hc_pre_from_prev_sublayer: bool = True
    q_head_norm: bool = False
    # -- MoE ---------------------------------------------------------------------------
    n_routed_experts: int = 384
    n_shared_experts: int = 1
    num_experts_per_tok: int = 6
    moe_intermediate_size: int = 2304
    routed_scaling_factor: float = 1.5
    scoring_func: str = "sqrtsoftplus"
    topk_method: str | None = "noaux_tc"
    norm_topk_prob: bool = True
    swiglu_limit: float = 10.0
    num_hash_layers: int = 0
    # -- compressed attention and indexer (MODEL_SPEC.md 3.2-3.6) ----------------------
    compress_ratios: tuple[int, ...] = ()
    kv_source_layer_ids: tuple[int, ...] = ()
    index_source_layer_ids: tuple[int, ...] = ()
    candidate_source_layer_id: int = -1
    candidate_topk_blocks: int = 0
    candidate_block_size: int = 0
    index_n_heads: int = 32
    index_head_dim: int = 128
    index_topk: int = 512
    # -- Engram (MODEL_SPEC.md 3.9) ----------------------------------------------------
    engram_layer_ids: tuple[int, ...] = ()
    engram_num_embeddings: tuple[int, ...] = ()
    engram_max_ngram_size: int = 4
    engram_n_heads: int = 8
    engram_head_dim: int = 256
    engram_vocab_size: int = 0
    engram_pad_token_id: int = 2
    engram_compressed_vocab_size: int = 0
    # -- DSpark draft stages (weights validated only; MODEL_SPEC.md 3.12) --------------
    n_mtp_layers: int = 3
    dspark_target_layer_ids: tuple[int, ...] = ()
    dspark_markov_rank: int = 0
    dspark_n_routed_experts: int = 0
    dspark_num_experts_per_tok: int = 0
    dspark_block_size: int = 0  # drafts per step (0: unset; the engine then uses 5, V4.1-Flash's value)
    dspark_noise_token_id: int = -1  # token fed at the non-anchor query slots (-1: unset)
    draft_vocab_size: int = 0
    # -- misc --------------------------------------------------------------------------
    bos_token_id: int = 0
    eos_token_id: int = 1
    image_token_id: int | None = None
    torch_dtype: str = "bfloat16"
    quant: QuantConfig = field(default_factory=QuantConfig)
    architectures: tuple[str, ...] = (ARCHITECTURE,)
    vision_config: dict | None = None

    # -- derived -----------------------------------------------------------------------
    @property
    def nope_head_dim(self) -> int:
        return self.head_dim - self.qk_rope_head_dim

    @property
    def engram_n_cols(self) -> int:
        """Hash columns per Engram layer: ``(N-1) * n_heads`` (2-grams first, then 3-grams...)."""
        return (self.engram_max_ngram_size - 1) * self.engram_n_heads

    @property
    def draft_n_routed_experts(self) -> int:
        return self.dspark_n_routed_experts or self.n_routed_experts

    @property
    def draft_num_experts_per_tok(self) -> int:
        return self.dspark_num_experts_per_tok or self.num_experts_per_tok

    def ratio(self, layer: int) -> int:
        """Compress ratio of backbone ``layer`` (0 past the end of ``compress_ratios``)."""
        return self.compress_ratios[layer] if layer < len(self.compress_ratios) else 0

    def is_hash_layer(self, layer: int) -> bool:  # V4's MoE asks; V4.1 has no hash routing
        return False

    def is_kv_source(self, layer: int) -> bool:
        return layer in self.kv_source_layer_ids

    def is_index_source(self, layer: int) -> bool:
        return layer in self.index_source_layer_ids

    def owns_index_keys(self, layer: int) -> bool:
        """An index source that is also a kv source projects the index keys (``wk``, ``k_norm``)."""
        return self.is_kv_source(layer) and self.is_index_source(layer)

    def kv_src(self, layer: int) -> int | None:
        """Nearest kv source at or below ``layer`` (None if there is none)."""
        return max((s for s in self.kv_source_layer_ids if s <= layer), default=None)

    def idx_src(self, layer: int) -> int | None:
        """Nearest index source at or below ``layer``: whose top-k a compressed layer attends to."""
        return max((s for s in self.index_source_layer_ids if s <= layer), default=None)

    def is_candidate_source(self, layer: int) -> bool:
        return self.candidate_source_layer_id >= 0 and layer == self.candidate_source_layer_id

    def is_candidate_consumer(self, layer: int) -> bool:
        """Index sources after the candidate source restrict their scores to its blocks."""
        return self.is_index_source(layer) and 0 <= self.candidate_source_layer_id < layer

    def is_engram_layer(self, layer: int) -> bool:
        return layer in self.engram_layer_ids

    # -- parsing -----------------------------------------------------------------------
    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "DeepseekV41Config":
        """Parse a native V4.1 ``config.json`` dict (nested, or already flat); unknown keys are ignored."""
        if not isinstance(raw, dict):
            raise V41ConfigError(f"config.json must hold a JSON object, got {type(raw).__name__}")
        flat = flatten_v41_config(raw)
        known = {f.name for f in fields(cls)} - {"quant"}
        kw: dict[str, Any] = {k: v for k, v in flat.items() if k in known}
        if kw.get("n_mtp_layers") is None:  # DSpark stage count: either name, 3 when absent
            nextn = flat.get("num_nextn_predict_layers")
            kw["n_mtp_layers"] = 3 if nextn is None else nextn
        kw["quant"] = _parse_quant(flat.get("quantization_config"), flat.get("expert_dtype"))
        for key in ("compress_ratios", "kv_source_layer_ids", "index_source_layer_ids", "engram_layer_ids",
                    "dspark_target_layer_ids", "architectures"):
            if key in kw:
                v = kw[key]
                if v is None:
                    kw[key] = ()
                elif isinstance(v, (list, tuple)):
                    kw[key] = tuple(v)
                else:
                    _bad(key, f"must be a list, got {v!r}")
        ne = kw.get("engram_num_embeddings")
        if ne is not None:
            if isinstance(ne, int) and not isinstance(ne, bool):
                kw["engram_num_embeddings"] = (ne,) * len(kw.get("engram_layer_ids", ()))
            elif isinstance(ne, (list, tuple)):
                kw["engram_num_embeddings"] = tuple(ne)
            else:
                _bad("engram_num_embeddings", f"must be a list of row counts (one per Engram layer), got {ne!r}")
        if kw.get("candidate_source_layer_id") is None:
            kw["candidate_source_layer_id"] = -1
        for key, unset in (("dspark_noise_token_id", -1), ("dspark_block_size", 0)):
            if key in kw and kw[key] is None:
                kw[key] = unset
        cfg = cls(**kw)
        cfg.validate()
        return cfg

    @classmethod
    def from_pretrained(cls, path: str | Path) -> "DeepseekV41Config":
        return cls.from_dict(read_config_json(path, V41ConfigError))

    # -- validation --------------------------------------------------------------------
    def validate(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim",
                     "q_lora_rank", "o_groups", "o_lora_rank", "sliding_window", "n_routed_experts",
                     "num_experts_per_tok", "moe_intermediate_size", "index_n_heads", "index_head_dim",
                     "index_topk", "hc_mult", "hc_sinkhorn_iters", "max_position_embeddings"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                _bad(name, f"must be a positive integer, got {v!r}")
        if self.num_key_value_heads != 1:
            _bad("num_key_value_heads", f"DeepSeek-V4.1 uses one shared KV head, got {self.num_key_value_heads}")
        if not 0 < self.qk_rope_head_dim < self.head_dim or self.qk_rope_head_dim % 2:
            _bad("qk_rope_head_dim", f"must be even and in (0, head_dim={self.head_dim}), got {self.qk_rope_head_dim}")
        if self.index_head_dim <= self.qk_rope_head_dim:
            _bad("index_head_dim", f"{self.index_head_dim} must exceed qk_rope_head_dim={self.qk_rope_head_dim} "
                                   "(index keys and queries rotate their last qk_rope_head_dim dims)")
        if self.num_attention_heads % self.o_groups:
            _bad("o_groups", f"{self.o_groups} does not divide num_attention_heads={self.num_attention_heads}")
        if self.num_experts_per_tok > self.n_routed_experts:
            _bad("num_experts_per_tok", f"{self.num_experts_per_tok} > n_routed_experts={self.n_routed_experts}")
        if self.n_shared_experts < 0:
            _bad("n_shared_experts", f"must be >= 0, got {self.n_shared_experts}")
        if self.scoring_func != "sqrtsoftplus":
            _bad("scoring_func", f"only 'sqrtsoftplus' is supported, got {self.scoring_func!r}")
        if self.topk_method not in (None, "noaux_tc"):
            _bad("topk_method", f"only 'noaux_tc' (biased top-k) is supported, got {self.topk_method!r}")
        if self.num_hash_layers:
            _bad("num_hash_layers", f"DeepSeek-V4.1 has no hash-routed layers, got {self.num_hash_layers}")
        if not self.hc_pre_from_prev_sublayer:
            _bad("hc_pre_from_prev_sublayer", "must be true for V4.1 (delayed mHC, no hc_head); "
                                              "a V4 checkpoint should use DeepseekV4ForCausalLM")
        rs = self.rope_scaling
        if rs is not None and (not isinstance(rs, dict) or rs.get("type", rs.get("rope_type")) not in ("yarn", None)):
            _bad("rope_scaling", f"only YaRN is supported, got {rs!r}")
        if rs and rs.get("type", rs.get("rope_type")) == "yarn" and "factor" not in rs:
            _bad("rope_scaling", "a YaRN rope_scaling needs 'factor'")
        self._validate_quant()
        self._validate_topology()
        self._validate_engram()
        self._validate_dspark()

    def _validate_quant(self) -> None:
        q = self.quant
        if not q.quantized:
            return
        if q.fmt != "e4m3":
            _bad("quantization_config.fmt", f"only 'e4m3' is supported, got {q.fmt!r}")
        if tuple(q.weight_block_size) != V41_BLOCK:
            _bad("quantization_config.weight_block_size",
                 f"DeepSeek-V4.1 FP8 linears use 32x32 blocks, got {list(q.weight_block_size)}")
        if q.scale_fmt != "ue8m0":
            _bad("quantization_config.scale_fmt", f"DeepSeek-V4.1 block scales are 'ue8m0', got {q.scale_fmt!r}")
        if q.expert_dtype not in ("fp8", "fp4"):
            _bad("quantization_config.expert_dtype", f"must be 'fp8' or 'fp4', got {q.expert_dtype!r}")
        for name in ("hidden_size", "moe_intermediate_size"):
            if q.expert_dtype == "fp4" and getattr(self, name) % 32:
                _bad(name, f"MXFP4 experts need it divisible by 32, got {getattr(self, name)}")

    def _layer_list(self, name: str, ids: tuple[int, ...], what: str) -> None:
        if len(set(ids)) != len(ids):
            _bad(name, f"lists a layer twice: {list(ids)}")
        for L in ids:
            if isinstance(L, bool) or not isinstance(L, int) or not 0 <= L < self.num_hidden_layers:
                _bad(name, f"{what} {L!r} is out of range [0, {self.num_hidden_layers})")

    def _validate_topology(self) -> None:
        n = self.num_hidden_layers
        for i, r in enumerate(self.compress_ratios):
            if i < n and r not in V41_RATIOS:
                _bad("compress_ratios", f"layer {i} has ratio {r!r}; DeepSeek-V4.1 supports {V41_RATIOS}")
        extra = [r for r in self.compress_ratios[n:] if r]
        if extra:  # draft (DSpark) layers are pure sliding-window whatever the list says
            logger.warning("compress_ratios lists non-zero ratios %s for the draft layers; they run with ratio 0",
                           extra)
        self._layer_list("kv_source_layer_ids", self.kv_source_layer_ids, "kv source layer")
        self._layer_list("index_source_layer_ids", self.index_source_layer_ids, "index source layer")
        for L in self.kv_source_layer_ids:
            if self.ratio(L) == 0:
                _bad("kv_source_layer_ids", f"kv source layer {L} is not compressed (ratio 0); a kv source "
                                            "owns the compressor of a ratio-1 or ratio-2 layer")
        for L in self.index_source_layer_ids:
            if self.ratio(L) == 0:
                _bad("index_source_layer_ids", f"index source layer {L} is not compressed (ratio 0)")
        for L in range(n):
            r = self.ratio(L)
            if not r:
                continue
            kv, ix = self.kv_src(L), self.idx_src(L)
            if kv is None:
                _bad("kv_source_layer_ids", f"compressed layer {L} (ratio {r}) has no kv source at or below it "
                                            f"(kv_source_layer_ids={list(self.kv_source_layer_ids)})")
            if ix is None:
                _bad("index_source_layer_ids", f"compressed layer {L} (ratio {r}) has no index source at or below "
                                               f"it (index_source_layer_ids={list(self.index_source_layer_ids)})")
            if self.ratio(kv) != r:
                _bad("kv_source_layer_ids", f"layer {L} has ratio {r} but its kv source {kv} has ratio "
                                            f"{self.ratio(kv)}; compressed positions would not line up")
            if self.ratio(ix) != r:
                _bad("index_source_layer_ids", f"layer {L} has ratio {r} but its index source {ix} has ratio "
                                               f"{self.ratio(ix)}; top-k positions would not line up")
        for L in self.index_source_layer_ids:
            owner = self.kv_src(L)
            if not self.is_index_source(owner):
                _bad("index_source_layer_ids", f"index source layer {L} reads the index keys of its kv source "
                                               f"{owner}, which is not an index source (only a layer that is "
                                               "both projects index keys)")
        c = self.candidate_source_layer_id
        if isinstance(c, bool) or not isinstance(c, int):
            _bad("candidate_source_layer_id", f"must be an int, got {c!r}")
        if c >= 0:
            if not self.is_index_source(c):
                _bad("candidate_source_layer_id", f"candidate source {c} is not an index source "
                                                  f"(index_source_layer_ids={list(self.index_source_layer_ids)})")
            for name in ("candidate_topk_blocks", "candidate_block_size"):
                v = getattr(self, name)
                if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                    _bad(name, f"must be a positive integer when candidate_source_layer_id={c}, got {v!r}")

    def _validate_engram(self) -> None:
        ids = self.engram_layer_ids
        if not ids:
            return
        self._layer_list("engram_layer_ids", ids, "Engram layer")
        for name in ("engram_max_ngram_size", "engram_n_heads", "engram_head_dim", "engram_vocab_size",
                     "engram_compressed_vocab_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                _bad(name, f"must be a positive integer for a model with Engram layers, got {v!r}")
        if self.engram_max_ngram_size < 2:
            _bad("engram_max_ngram_size", f"must be >= 2 (2-grams and up are hashed), got {self.engram_max_ngram_size}")
        if self.engram_head_dim % 32:
            _bad("engram_head_dim", f"must be a multiple of 32 (one UE8M0 scale per 32 values), "
                                    f"got {self.engram_head_dim}")
        if len(self.engram_num_embeddings) != len(ids):
            _bad("engram_num_embeddings", f"has {len(self.engram_num_embeddings)} entries for "
                                          f"{len(ids)} Engram layers {list(ids)}")
        if not 0 <= self.engram_pad_token_id < self.vocab_size:
            _bad("engram_pad_token_id", f"{self.engram_pad_token_id} is not a token id (vocab {self.vocab_size})")
        from deepinfer_models.deepseek_v41.engram_hash import engram_primes

        primes = engram_primes(len(ids), self.engram_max_ngram_size, self.engram_n_heads, self.engram_vocab_size)
        for L, rows, ps in zip(ids, self.engram_num_embeddings, primes):
            if isinstance(rows, bool) or not isinstance(rows, int) or rows < sum(ps):
                _bad("engram_num_embeddings", f"Engram layer {L} has {rows!r} rows but its hash buckets need "
                                              f"{sum(ps)} (the sum of its primes)")

    def _validate_dspark(self) -> None:
        if isinstance(self.n_mtp_layers, bool) or not isinstance(self.n_mtp_layers, int) or self.n_mtp_layers < 0:
            _bad("n_mtp_layers", f"must be a non-negative integer, got {self.n_mtp_layers!r}")
        for L in self.dspark_target_layer_ids:
            if isinstance(L, bool) or not isinstance(L, int) or not 0 <= L < self.num_hidden_layers:
                _bad("dspark_target_layer_ids", f"target layer {L!r} is out of range [0, {self.num_hidden_layers})")
        b = self.dspark_block_size
        if isinstance(b, bool) or not isinstance(b, int) or not 0 <= b <= 16:
            _bad("dspark_block_size", f"must be an integer in [0, 16] (0 = unset), got {b!r}")
        t = self.dspark_noise_token_id
        if isinstance(t, bool) or not isinstance(t, int) or not -1 <= t < self.vocab_size:
            _bad("dspark_noise_token_id", f"must be a token id below vocab_size={self.vocab_size} (or -1 = unset), "
                                          f"got {t!r}")

    # -- serialisation -----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The nested native ``config.json`` dict (inverse of ``from_dict``)."""
        text: dict[str, Any] = {"model_type": "deepseek_v41_text"}
        for f in fields(self):
            if f.name in ("quant", "architectures", "torch_dtype", "vision_config"):
                continue
            v = getattr(self, f.name)
            text[f.name] = list(v) if isinstance(v, tuple) else v
        out: dict[str, Any] = {"architectures": list(self.architectures), "model_type": "deepseek_v41",
                               "torch_dtype": self.torch_dtype}
        if self.quant.quantized:
            out["quantization_config"] = {
                "quant_method": "fp8", "fmt": self.quant.fmt, "scale_fmt": self.quant.scale_fmt,
                "activation_scheme": "dynamic", "weight_block_size": list(self.quant.weight_block_size),
                "expert_dtype": self.quant.expert_dtype}
        out["text_config"] = text
        out["vision_config"] = dict(self.vision_config) if self.vision_config is not None else {
            "model_type": "deepseek_v41_vision", "num_hidden_layers": 0}
        return out


def flatten_v41_config(raw: dict[str, Any]) -> dict[str, Any]:
    """Nested V4.1 config -> one flat dict (``text_config`` keys win; vision kept as ``vision_config``)."""
    flat = {k: v for k, v in raw.items() if k != "text_config"}
    text = raw.get("text_config")
    if text is not None:
        if not isinstance(text, dict):
            _bad("text_config", f"must be an object, got {type(text).__name__}")
        for k, v in text.items():
            if k != "model_type":
                flat[k] = v
    model_type = raw.get("model_type")
    if model_type not in (None, "deepseek_v41", "deepseek_v41_text"):
        _bad("model_type", f"expected 'deepseek_v41', got {model_type!r}")
    if model_type == "deepseek_v41" and text is None:
        _bad("text_config", "a 'deepseek_v41' config.json nests the text model under 'text_config', which is missing")
    if flat.get("rope_scaling") is None and isinstance(flat.get("rope_parameters"), dict):
        flat["rope_scaling"] = flat["rope_parameters"]
    return flat


def _parse_quant(q: Any, expert_dtype: Any) -> QuantConfig:
    if not q:
        if expert_dtype not in (None, "bf16", "bfloat16"):
            _bad("expert_dtype", f"{expert_dtype!r} needs a quantization_config")
        return QuantConfig()
    if not isinstance(q, dict):
        _bad("quantization_config", f"must be an object, got {type(q).__name__}")
    method = q.get("quant_method", "fp8")
    if method not in QUANT_METHODS:
        _bad("quantization_config.quant_method", f"{method!r} is not supported (expected one of {QUANT_METHODS})")
    bs = q.get("weight_block_size", list(V41_BLOCK))
    if not (isinstance(bs, (list, tuple)) and len(bs) == 2 and all(isinstance(b, int) and b > 0 for b in bs)):
        _bad("quantization_config.weight_block_size", f"must be two positive ints, got {bs!r}")
    ed = q.get("expert_dtype", expert_dtype) or "fp4"
    return QuantConfig(fmt=q.get("fmt", "e4m3"), weight_block_size=tuple(bs), scale_fmt=q.get("scale_fmt", "ue8m0"),
                       expert_dtype=ed)


__all__ = ["DeepseekV41Config", "V41ConfigError", "flatten_v41_config", "ARCHITECTURE"]
