"""DeepSeek-V4 MoE FFN: sqrtsoftplus router (biased top-k, or hash routing on the first
layers), routed experts with clamped SwiGLU, plus the shared expert."""
from __future__ import annotations

import torch

from deepinfer_core.kernels.ops.moe import clamped_swiglu
from deepinfer_models.deepseek_v4.config import DeepseekV4Config


class MoEV4:
    def __init__(self, cfg: DeepseekV4Config, layer: int, w: dict, make_linear, kernels: dict, dtype: torch.dtype):
        p = f"layers.{layer}.ffn"
        self.cfg, self.k = cfg, kernels
        self.gate_w = w[f"{p}.gate.weight"].float()  # router in fp32
        self.is_hash = cfg.is_hash_layer(layer)
        self.tid2eid = w[f"{p}.gate.tid2eid"].long() if self.is_hash else None
        self.bias = None if self.is_hash else w[f"{p}.gate.bias"].float()
        # Reference experts run on dequantised weights; device providers keep their own layout.
        ex = [[make_linear(f"{p}.experts.{e}.{n}").dequantized(dtype) for e in range(cfg.n_routed_experts)]
              for n in ("w1", "w3", "w2")]
        self.w1, self.w3, self.w2 = (torch.stack(t) for t in ex)
        self.s1, self.s3, self.s2 = (make_linear(f"{p}.shared_experts.{n}") for n in ("w1", "w3", "w2"))

    def __call__(self, x: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        """x [T, D] (normed FFN input), input_ids [T] (hash routing) -> [T, D]."""
        cfg = self.cfg
        logits = self.k["gemm.dense"](x.float(), self.gate_w)
        if self.is_hash:
            weights, ids = self.k["moe.route_hash"](logits, self.tid2eid[input_ids], cfg.routed_scaling_factor)
        else:
            weights, ids = self.k["moe.route_topk"](logits, self.bias, cfg.num_experts_per_tok, cfg.routed_scaling_factor)
        routed = self.k["moe.experts"](x, weights, ids, self.w1, self.w3, self.w2, cfg.swiglu_limit)
        shared = self.s2(clamped_swiglu(self.s1(x), self.s3(x), cfg.swiglu_limit))
        return routed + shared
