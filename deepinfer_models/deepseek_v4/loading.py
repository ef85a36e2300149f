"""Load a native DeepSeek-V4 checkpoint directory into ``DeepseekV4ForCausalLM``."""
from __future__ import annotations

from pathlib import Path

import torch

from deepinfer_core.loader import load_checkpoint
from deepinfer_models.deepseek_v4.config import DeepseekV4Config
from deepinfer_models.deepseek_v4.model import DeepseekV4ForCausalLM
from deepinfer_models.deepseek_v4.moe import is_routed_expert
from deepinfer_models.deepseek_v4.weights import expected_tensors

# MTP (draft) weights are not used by the V4 target model.
SKIP_PREFIXES = ("mtp.",)


def load_deepseek_v4(model_dir: str | Path, dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu",
                     platform=None, progress: bool = False, **model_kw) -> DeepseekV4ForCausalLM:
    cfg = DeepseekV4Config.from_pretrained(model_dir)
    weights = load_checkpoint(model_dir, expected_tensors(cfg), skip_prefixes=SKIP_PREFIXES, progress=progress)
    # routed experts stay on the host until MoEV4 stacks them (one device copy, not two)
    weights = {k: v if is_routed_expert(k) else v.to(device) for k, v in weights.items()}
    return DeepseekV4ForCausalLM(cfg, weights, dtype=dtype, device=device, platform=platform, **model_kw)
