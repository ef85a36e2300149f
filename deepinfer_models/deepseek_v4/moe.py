"""DeepSeek-V4 MoE FFN: sqrtsoftplus router (biased top-k, or hash routing on the first
layers), routed experts with clamped SwiGLU, plus the shared expert."""
from __future__ import annotations

import os

import torch

from deepinfer_models.deepseek_v4.config import DeepseekV4Config
from deepinfer_models.layers import linear as _linear
from deepinfer_models.layers.linear import LinearGroup


# ``MoEV4.parts`` hands the routed and shared outputs to ``mhc.expand`` unsummed, which adds them in fp32 in its own
# launch: one small kernel (and its dependency) fewer a layer. ``DEEPINFER_MOE_SUM_IN_EXPAND=0``: the sum as its own
# op, rounded to the activation dtype (the A/B baseline of docs/performance.md, thirty-sixth pass).
SUM_IN_EXPAND = os.environ.get("DEEPINFER_MOE_SUM_IN_EXPAND", "1") == "1"
# The shared expert forks before the router. Forking it after the router's top-k instead measured slower on an H100
# (forty-seventh pass, pass47a: batch 1 +35 us, batch 32 +225 us, every reading): its ~35 MB then compete with the
# swap experts, which hold the chain longer than the router does.
# the routed-experts op of each expert format (``Linear`` refuses any other)
_EXPERTS_OP = {"dense": "moe.experts", "fp8": "moe.experts_fp8", "mxfp4": "moe.experts_mxfp4"}


def is_routed_expert(name: str) -> bool:
    """A per-expert checkpoint tensor of a routed expert (``layers.L.ffn.experts.E.*``, also in ``mtp.*``)."""
    return ".ffn.experts." in name


class MoEV4:
    def __init__(self, cfg: DeepseekV4Config, layer: int, w: dict, make_linear, kernels: dict, dtype: torch.dtype,
                 merge_projections: bool | None = None):
        """``merge_projections``: the shared expert's w1 and w3 as one product (``LinearGroup``; default
        ``layers.linear.MERGE_PROJECTIONS``)."""
        p = f"layers.{layer}.ffn"
        self.cfg, self.k = cfg, kernels
        self.is_hash = cfg.is_hash_layer(layer)
        # the router's logits are fp32: its weight widened at load, or as stored (``float_projection``)
        self.gate_w = _linear.float_projection(w[f"{p}.gate.weight"])
        self.tid2eid = w[f"{p}.gate.tid2eid"].long() if self.is_hash else None
        self.bias = None if self.is_hash else w[f"{p}.gate.bias"].float()
        # Experts stay in the checkpoint layout (stacked over experts); the op for that layout
        # dequantises only the routed experts (a real V4 layer is 12.9 GB in bf16, 3.2 GB in MXFP4).
        lins = {n: [make_linear(f"{p}.experts.{e}.{n}") for e in range(cfg.n_routed_experts)] for n in ("w1", "w3", "w2")}
        self.fmt = lins["w1"][0].fmt
        self.experts_op = _EXPERTS_OP[self.fmt]
        self.block = lins["w1"][0].block
        # The loaders leave routed experts in host memory (``is_routed_expert``): the stack is built
        # there and only the stacked copy moves to the device, so the device never holds both.
        device = self.gate_w.device
        self.experts = []
        for n in ("w1", "w3", "w2"):
            self.experts.append(torch.stack([lin.weight for lin in lins[n]]).to(device))
            if self.fmt != "dense":
                self.experts.append(torch.stack([lin.scale for lin in lins[n]]).to(device))
        if self.fmt == "mxfp4":  # the layout the platform's expert kernels read best (the checkpoint's, or repacked)
            self.experts = list(self.k["moe.experts_mxfp4_layout"](*self.experts))
        s1, s3, self.s2 = (make_linear(f"{p}.shared_experts.{n}") for n in ("w1", "w3", "w2"))
        # the shared expert's gate and up projections read the same x: one product where merged
        self.s13 = LinearGroup([s1, s3], _linear.MERGE_PROJECTIONS if merge_projections is None else merge_projections)

    def __call__(self, x: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        """x [T, D] (normed FFN input), input_ids [T] (hash routing) -> [T, D]: the routed and shared experts' sum."""
        routed, shared = self._routed_shared(x, input_ids)
        return routed + shared

    def parts(self, x: torch.Tensor, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | torch.Tensor:
        """x [T, D], input_ids [T] -> ``(routed, shared)``, each [T, D] in x.dtype, unsummed: ``mhc.expand`` takes
        them as the sublayer output's parts and adds them in fp32 in its own launch, so the sum launches nothing
        (one small kernel and its dependency a layer at batch 1). With ``SUM_IN_EXPAND`` off: their sum [T, D]."""
        routed, shared = self._routed_shared(x, input_ids)
        return (routed, shared) if SUM_IN_EXPAND else routed + shared

    def _routed_shared(self, x: torch.Tensor, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        # the shared expert reads only x: a branch beside the routed path (a second stream where the platform
        # has one; in order elsewhere), joined before the sum
        shared = self.k["stream.side"](self._shared, x)
        if self.is_hash:
            logits = self.k["gemm.dense_wide"](x, self.gate_w)  # fp32 router: x widened in the kernel
            weights, ids = self.k["moe.route_hash"](logits, self.tid2eid[input_ids], cfg.routed_scaling_factor)
        elif self.fmt == "mxfp4":  # the router and the experts as one op: a platform may lay out the routing as it routes
            return self.k["moe.topk_experts_mxfp4"](x, self.gate_w, self.bias, cfg.num_experts_per_tok,
                                                    cfg.routed_scaling_factor, *self.experts,
                                                    cfg.swiglu_limit), shared.join()
        else:  # the fp32 router's logits and the biased top-k: one op (composed from its two parts)
            weights, ids = self.k["moe.router_topk"](x, self.gate_w, self.bias, cfg.num_experts_per_tok,
                                                     cfg.routed_scaling_factor)
        block = (self.block,) if self.fmt == "fp8" else ()
        routed = self.k[self.experts_op](x, weights, ids, *self.experts, *block, cfg.swiglu_limit)
        return routed, shared.join()

    def _shared(self, x: torch.Tensor) -> torch.Tensor:
        """The shared expert: x [T, D] -> [T, D] (gate and up as one product where merged)."""
        gate, up = self.s13(x)
        return self.s2(self.k["moe.clamped_swiglu"](gate, up, self.cfg.swiglu_limit))
