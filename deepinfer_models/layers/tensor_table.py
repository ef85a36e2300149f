"""Expected-tensor tables of native DeepSeek checkpoints: shared by the V4 and V4.1 layouts.

``TensorTableBuilder`` accumulates ``TensorSpec`` entries (name -> shape, allowed dtypes, role)
and applies the checkpoint's quantisation to linears, so each model's ``weights.py`` only lists
its names and shapes. The first dtype of each entry is the one the checkpoint writers use.
"""
from __future__ import annotations

import torch

from deepinfer_core.kernels.ops.quant import MXFP4_GROUP, fp8_block_scale_shape
from deepinfer_core.loader import TensorSpec

BF16 = (torch.bfloat16,)
BF16_OR_FP32 = (torch.bfloat16, torch.float32)
FP32 = (torch.float32,)
UE8M0 = (torch.float8_e8m0fnu, torch.uint8)  # raw scale bytes may be stored as U8
PACKED = (torch.uint8, torch.int8)


class TensorTableBuilder:
    """Accumulates specs for a config with ``quant`` (QuantConfig), ``hc_mult`` and ``hidden_size``."""

    def __init__(self, cfg, raw_scale_bytes: bool = False) -> None:
        """``raw_scale_bytes``: also accept UE8M0 scales stored as U8 (V4.1 checkpoints do)."""
        self.cfg, self.q = cfg, cfg.quant
        self.ue8m0 = UE8M0 if raw_scale_bytes else UE8M0[:1]
        self.specs: dict[str, TensorSpec] = {}
        # Unquantised checkpoints may store any bf16 tensor as fp32 too.
        self.plain = BF16 if self.q.quantized else BF16_OR_FP32

    def add(self, name: str, shape, dtypes, role: str) -> None:
        if name in self.specs:  # a layout bug, not bad input
            raise AssertionError(f"duplicate tensor name {name}")
        self.specs[name] = TensorSpec(tuple(shape), tuple(dtypes), role)

    def bf16(self, name: str, shape, role: str = "dense") -> None:
        self.add(name, shape, self.plain, role)

    def norm(self, name: str, dim: int) -> None:
        self.add(name, (dim,), BF16_OR_FP32, "norm")

    def fp32(self, name: str, shape) -> None:
        self.add(name, shape, FP32, "fp32")

    def linear(self, prefix: str, n: int, k: int, kind: str = "dense") -> None:
        """``prefix.weight [n, k]`` (+ ``prefix.scale``): ``kind`` ``dense`` (FP8 when quantised),
        ``expert`` (FP8 or MXFP4 per ``expert_dtype``) or ``bf16`` (never quantised)."""
        fmt = None
        if self.q.quantized and kind != "bf16":
            fmt = "mxfp4" if kind == "expert" and self.q.expert_dtype == "fp4" else "fp8"
        if fmt is None:
            self.bf16(f"{prefix}.weight", (n, k))
        elif fmt == "fp8":
            scale = self.ue8m0 if self.q.scale_fmt == "ue8m0" else FP32
            self.add(f"{prefix}.weight", (n, k), (torch.float8_e4m3fn,), "fp8_weight")
            self.add(f"{prefix}.scale", fp8_block_scale_shape(n, k, tuple(self.q.weight_block_size)), scale,
                     "fp8_scale")
        else:
            if k % MXFP4_GROUP:
                raise ValueError(f"{prefix}: MXFP4 experts need the input dim ({k}) divisible by {MXFP4_GROUP}")
            self.add(f"{prefix}.weight", (n, k // 2), PACKED, "mxfp4_weight")
            self.add(f"{prefix}.scale", (n, k // MXFP4_GROUP), self.ue8m0, "mxfp4_scale")

    def experts(self, prefix: str, n_experts: int) -> None:
        """A MoE layer's ``n_experts`` routed experts ``{prefix}.experts.{e}.w1/w2/w3`` (expert format) and, when the
        config has them, its shared experts ``{prefix}.shared_experts.w1/w2/w3`` (dense format, ``n_shared_experts``
        times the expert width)."""
        d, f = self.cfg.hidden_size, self.cfg.moe_intermediate_size
        for e in range(n_experts):
            self.linear(f"{prefix}.experts.{e}.w1", f, d, kind="expert")
            self.linear(f"{prefix}.experts.{e}.w2", d, f, kind="expert")
            self.linear(f"{prefix}.experts.{e}.w3", f, d, kind="expert")
        fs = f * self.cfg.n_shared_experts
        if fs:
            self.linear(f"{prefix}.shared_experts.w1", fs, d)
            self.linear(f"{prefix}.shared_experts.w2", d, fs)
            self.linear(f"{prefix}.shared_experts.w3", fs, d)

    def hc(self, prefix: str) -> None:
        """A sublayer's mHC mix parameters ``{prefix}_fn/_base/_scale``."""
        n, d = self.cfg.hc_mult, self.cfg.hidden_size
        self.fp32(f"{prefix}_fn", ((2 + n) * n, n * d))
        self.fp32(f"{prefix}_base", ((2 + n) * n,))
        self.fp32(f"{prefix}_scale", (3,))

    def attention_core(self, p: str) -> None:
        """Tensors every V4.x attention layer has: low-rank query, shared KV, grouped output, sinks."""
        cfg = self.cfg
        D, H, d = cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim
        G, ql = cfg.o_groups, cfg.q_lora_rank
        self.linear(f"{p}.wq_a", ql, D)
        self.norm(f"{p}.q_norm.weight", ql)
        self.linear(f"{p}.wq_b", H * d, ql)
        self.linear(f"{p}.wkv", d, D)
        self.norm(f"{p}.kv_norm.weight", d)
        self.linear(f"{p}.wo_a", G * cfg.o_lora_rank, H * d // G)
        self.linear(f"{p}.wo_b", D, G * cfg.o_lora_rank)
        self.fp32(f"{p}.attn_sink", (H,))
