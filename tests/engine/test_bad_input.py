"""Bad input gets a clear error for that request; the other requests finish unchanged."""
from __future__ import annotations

import json

import pytest

from deepinfer_core import LLM, SamplingParams
from deepinfer_core.hub import ModelNotFoundError
from deepinfer_core.loader import CheckpointError
from tests.engine.conftest import random_prompt

GOOD = random_prompt(30, 77)
SP = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_v4_dir):
    return LLM(str(tiny_v4_dir), dtype="float32", max_model_len=64, kv_cache_memory_bytes=32 << 20)


@pytest.fixture(scope="module")
def good_alone(llm):
    return llm.generate([GOOD], SP, use_tqdm=False)[0].outputs[0].token_ids


def _bad_params(**field):
    sp = SamplingParams(max_tokens=6)
    for k, v in field.items():
        object.__setattr__(sp, k, v)  # bypass construction-time validation: the engine must re-check
    return sp


@pytest.mark.parametrize("prompt,params,needle", [
    (random_prompt(80, 1), SP, "max_model_len"),
    ("", SP, "prompt is empty"),
    ([], SP, "empty"),
    ([5, 129280, 7], SP, "outside the vocabulary"),
    ([5, -1], SP, "outside the vocabulary"),
    (GOOD, _bad_params(max_tokens=0), "max_tokens"),
    (GOOD, _bad_params(top_p=1.5), "top_p"),
    (GOOD, _bad_params(top_p=0.0), "top_p"),
    (GOOD, _bad_params(temperature=-0.5), "temperature"),
    ({"prompt": "hi", "multi_modal_data": {"image": b"..."}}, SP, "image"),
])
def test_bad_request_fails_alone(llm, good_alone, prompt, params, needle):
    outs = llm.generate([GOOD, prompt, GOOD], [SP, params, SP], use_tqdm=False)
    bad = outs[1]
    assert bad.error is not None and needle in bad.error, bad.error
    assert bad.outputs[0].finish_reason == "error" and bad.finished
    for ok in (outs[0], outs[2]):
        assert ok.error is None
        assert ok.outputs[0].token_ids == good_alone


def test_invalid_sampling_params_raise_clear_errors_at_construction():
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=1.5)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1.0)


def test_bad_chat_message_fails_alone(llm):
    outs = llm.chat([[{"role": "user", "content": "hello"}], [{"role": "wizard", "content": "x"}]], SP, use_tqdm=False)
    assert outs[0].error is None and len(outs[0].outputs[0].token_ids) == 6
    assert outs[1].error is not None and "role" in outs[1].error


def test_unknown_model_path(tmp_path):
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        LLM(str(tmp_path / "nope"))


def test_unknown_hub_model_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError, match="local"):
        LLM("deepseek-ai/DeepSeek-V4.1-Flash-1017")


def test_corrupt_checkpoint(tiny_v4_dir, tmp_path):
    import shutil

    bad = tmp_path / "corrupt"
    shutil.copytree(tiny_v4_dir, bad)
    shard = next(bad.glob("*.safetensors"))
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=shard.name):
        LLM(str(bad), dtype="float32")


def test_bad_config(tiny_v4_dir, tmp_path):
    import shutil

    bad = tmp_path / "badcfg"
    shutil.copytree(tiny_v4_dir, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["compress_ratios"] = [0, 3, 128, 4]
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="compress_ratios"):
        LLM(str(bad), dtype="float32")
