"""Greedy generation through the engine equals transformers' stateless recompute.

The oracle: at every step, run transformers' DeepseekV4ForCausalLM on the whole sequence
with ``use_cache=False`` and take the argmax of the last position (its cached decode drifts,
MODEL_SPEC.md). Prompts cross the sliding window (16) and every compression ratio (4, 128).
"""
from __future__ import annotations

import pytest
import torch

from deepinfer_core import LLM, SamplingParams
from tests.engine.conftest import random_prompt
from tests.oracle.hf_v4 import hf_model_from_native


def hf_greedy(hf, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    out = []
    with torch.no_grad():
        for _ in range(n):
            logits = hf(torch.tensor([ids]), use_cache=False).logits[0, -1]
            tok = int(torch.argmax(logits))
            out.append(tok)
            ids.append(tok)
    return out


@pytest.mark.parametrize("prompt_len", [20, 250])
def test_greedy_matches_transformers_stateless_recompute(tiny_v4_dir, prompt_len):
    prompt = random_prompt(prompt_len, 40 + prompt_len)
    n = 16  # 250 + 16 crosses the 256-token HCA window boundary
    llm = LLM(str(tiny_v4_dir), dtype="float32", max_model_len=512, kv_cache_memory_bytes=64 << 20)
    ours = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True), use_tqdm=False)[0]
    hf = hf_model_from_native(tiny_v4_dir, dtype=torch.float32)
    assert ours.outputs[0].token_ids == hf_greedy(hf, prompt, n)
