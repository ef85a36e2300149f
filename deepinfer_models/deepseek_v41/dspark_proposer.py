"""DSpark as the engine's speculative proposer (``deepinfer_core.spec_decode.proposer.Proposer``).

A thin adapter over ``DSparkDrafter`` (dspark.py holds the math): the engine calls
``observe`` after every target step (features -> draft context KV) and ``propose`` for the
requests that sampled. Built by ``DeepseekV41ForCausalLM.load_proposer``.
"""
from __future__ import annotations

from pathlib import Path

import torch

from deepinfer_core.runner.context import StepContext
from deepinfer_core.spec_decode.proposer import DraftBatch
from deepinfer_models.deepseek_v41.compressor import RING
from deepinfer_models.deepseek_v41.dspark import DSparkDrafter, DSparkError, load_dspark_weights

DEFAULT_BLOCK_SIZE = 5  # V4.1-Flash (SGLang's recipe: --speculative-dspark-block-size 5)


class DSparkProposer:
    def __init__(self, drafter: DSparkDrafter):
        self.drafter = drafter
        self.num_draft_tokens = drafter.n
        self.tap_layer_ids = drafter.target_layer_ids
        self.has_confidence = drafter.conf_w is not None

    def kv_cache_specs(self):
        return self.drafter.kv_cache_specs()

    def observe(self, taps: dict[int, torch.Tensor], ctx: StepContext) -> None:
        self.drafter.write_context_kv(self.drafter.combine(taps), ctx)

    def propose(self, anchor_ids: torch.Tensor, ctx: StepContext, seeds, temperatures) -> DraftBatch:
        out = self.drafter.propose(anchor_ids, ctx, seeds=seeds, temperatures=temperatures)
        probs = None
        if any(s is not None for s in seeds):  # the distributions the sampled drafts came from
            t = torch.tensor(temperatures, dtype=torch.float32, device=out.logits.device)[:, None, None]
            probs = torch.softmax(out.logits / t, dim=-1)
        return DraftBatch(out.tokens, probs, out.confidence)


def load_dspark_proposer(target, model_dir: str | Path, spec, platform=None, kernel_overrides=None) -> DSparkProposer:
    """``spec``: a SpeculativeConfig (``num_speculative_tokens`` None -> ``dspark_block_size`` or 5)."""
    cfg = target.cfg
    n = spec.num_speculative_tokens or cfg.dspark_block_size or DEFAULT_BLOCK_SIZE
    if n + 2 > RING:
        # A verify step writes N+1 ring rows before acceptance is known while the next step still
        # needs the last committed row (ENGINE_FEATURES.md 1.7): the ratio-2 ring must hold N+2.
        raise DSparkError(f"num_speculative_tokens={n} needs a compressor ring of {n + 2} rows; it has {RING}")
    if cfg.dspark_noise_token_id < 0:
        raise DSparkError(f"{model_dir}/config.json has no dspark_noise_token_id: DSpark cannot build its query block")
    weights = load_dspark_weights(model_dir, cfg)
    drafter = DSparkDrafter(target, weights, num_draft_tokens=n, noise_token_id=cfg.dspark_noise_token_id,
                            platform=platform, kernel_overrides=kernel_overrides)
    return DSparkProposer(drafter)
