"""Programmatic dependent launch across a whole engine step on the H200 (not run in CI).

With ``_common.PDL`` on, every Triton / Gluon kernel of the step that takes part (``triton_pdl``) is launched
with PDL and waits for its predecessor on the device. That changes when kernels start, never what they compute,
so the engine's outputs (tokens and logprobs, greedy and seeded sampling, prefill and graphed decode steps,
chained launches) must equal the PDL-off run bit for bit, on tiny V4.1 and V4 checkpoints with MXFP4 experts.

    python3 -m pytest -q deepinfer_nvidia/tests/test_conformance_pdl.py
"""
from __future__ import annotations

import pytest
import torch

from deepinfer_core import LLM, SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    from deepinfer_models.deepseek_v41.checkpoint_writer import tiny_v41_config, write_tiny_v41_checkpoint
    from deepinfer_models.testing import write_tiny_v4_checkpoint

    root = tmp_path_factory.mktemp("pdl")
    return {"v41": write_tiny_v41_checkpoint(root / "v41", tiny_v41_config("mixed"), quant="fp4", seed=2),
            "v4": write_tiny_v4_checkpoint(root / "v4", quant="fp4", seed=4)}


def _run(path, pdl: int, monkeypatch):
    from deepinfer_nvidia.kernels import _common
    from deepinfer_nvidia.platform import NvidiaPlatform

    monkeypatch.setattr(_common, "PDL", pdl)
    llm = LLM(str(path), dtype="bfloat16", max_model_len=512, max_num_seqs=8, kv_cache_memory_bytes=1 << 30,
              max_num_batched_tokens=4096, platform=NvidiaPlatform(), graph_capture_sizes=[1, 2, 4, 8])
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 1000, (n,), generator=g).tolist() for n in (5, 40, 90, 13, 70, 9)]
    params = [SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=3),
              SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=16, ignore_eos=True, logprobs=1)] * 3
    outs = llm.generate(prompts, params, use_tqdm=False)
    steps = llm.llm_engine.executor.graphs.steps
    del llm
    torch.cuda.synchronize()
    return [(list(o.outputs[0].token_ids), [sorted((k, v.logprob) for k, v in d.items())
                                            for d in o.outputs[0].logprobs]) for o in outs], steps


@pytest.mark.parametrize("arch", ["v41", "v4"])
def test_pdl_changes_no_output(ckpts, arch, monkeypatch):
    want, graphed_off = _run(ckpts[arch], 0, monkeypatch)
    got, graphed = _run(ckpts[arch], 1, monkeypatch)
    print(f"{arch}: graphed decode steps without PDL {graphed_off}, with PDL {graphed}")
    assert graphed_off > 0 and graphed > 0  # decode ran in CUDA graphs (captured with the PDL launches)
    assert got == want
