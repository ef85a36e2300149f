from __future__ import annotations

import pytest
import torch


from deepinfer_core import LLM
from deepinfer_models.testing import write_tiny_v4_checkpoint


@pytest.fixture(scope="session")
def tiny_v4_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("engine_v4")
    write_tiny_v4_checkpoint(d, quant="fp8", seed=5)
    return d


def random_prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 129000, (n,), generator=g).tolist()


def sig(out):
    """A RequestOutput's first sequence as (token ids, sorted (token, logprob) pairs per position): equal
    signatures mean bitwise equal tokens and logprobs."""
    o = out.outputs[0]
    return o.token_ids, [sorted((k, v.logprob) for k, v in d.items()) for d in o.logprobs]


def make(d, **kw):
    """An fp32 LLM over checkpoint ``d`` with a 128 MiB KV budget unless ``kw`` says otherwise."""
    kw.setdefault("kv_cache_memory_bytes", 128 << 20)
    return LLM(str(d), dtype="float32", max_model_len=1024, **kw)
