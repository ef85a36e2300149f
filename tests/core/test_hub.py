"""Model resolution: local dirs, the HF hub (offline / unreachable only; no network), embedded checkpoints."""
from __future__ import annotations

import json
import re
import threading
import time

import huggingface_hub.constants
import pytest

from deepinfer_core import hub
from deepinfer_core.hub import (
    DEFAULT_MODEL,
    ModelNotFoundError,
    embedded_model_names,
    register_embedded_model,
    resolve_model_path,
)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    """Private caches, no hub endpoint that can be reached, clean registry."""
    monkeypatch.setenv("DEEPINFER_CACHE", str(tmp_path / "deepinfer-cache"))
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")  # refuses connections
    monkeypatch.setattr(hub, "_EMBEDDED", {})


def _one_sentence(msg: str) -> bool:
    body = msg.replace("e.g.", "eg")  # the abbreviation is not a sentence end
    return "\n" not in msg and msg.endswith(".") and re.search(r"[.!?]\s+[A-Z]", body) is None


def test_offline_error_is_one_actionable_sentence(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError) as ei:
        resolve_model_path(DEFAULT_MODEL, cache_dir=tmp_path / "hf")
    msg = str(ei.value)
    assert DEFAULT_MODEL == "deepseek-ai/DeepSeek-V4.1-Flash-1017"
    assert f"weights for '{DEFAULT_MODEL}' could not be fetched" in msg
    assert "HF_HUB_OFFLINE=1" in msg
    assert 'LLM(model="/path/to/DeepSeek-V4.1-Flash-1017")' in msg and "--model /path/to/" in msg
    assert _one_sentence(msg), msg
    assert isinstance(ei.value, ValueError) and ei.value.__cause__ is not None


def test_unreachable_hub_error(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    with pytest.raises(ModelNotFoundError, match="could not be reached") as ei:
        resolve_model_path("some-org/some-model", cache_dir=tmp_path / "hf")
    assert _one_sentence(str(ei.value)) and "/path/to/some-model" in str(ei.value)


def test_offline_uses_hf_cache(monkeypatch, tmp_path):
    # Lay out a snapshot the way huggingface_hub caches one.
    repo = tmp_path / "hf" / "models--some-org--tiny"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0123abcd")
    snap = repo / "snapshots" / "0123abcd"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_model_path("some-org/tiny", cache_dir=tmp_path / "hf") == snap
    # A cached repo without config.json is not a checkpoint.
    (snap / "config.json").unlink()
    with pytest.raises(ModelNotFoundError, match="has no config.json"):
        resolve_model_path("some-org/tiny", cache_dir=tmp_path / "hf")


def test_invalid_repo_id(tmp_path):
    with pytest.raises(ModelNotFoundError, match="neither an existing local directory nor a valid hub repo id"):
        resolve_model_path("a/b/c", cache_dir=tmp_path / "hf")


def test_local_directories(tmp_path, monkeypatch):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    with pytest.raises(ModelNotFoundError, match="has no config.json"):
        resolve_model_path(str(ckpt))
    (ckpt / "config.json").write_text("{}")
    assert resolve_model_path(str(ckpt)) == ckpt
    monkeypatch.chdir(tmp_path)
    assert resolve_model_path("ckpt") == resolve_model_path("./ckpt") == ckpt.relative_to(tmp_path)
    with pytest.raises(ModelNotFoundError, match="is a file, not a checkpoint directory"):
        resolve_model_path(str(ckpt / "config.json"))
    for missing in (str(tmp_path / "nope"), "./nope", "~/definitely-not-a-dir-4f1c"):
        with pytest.raises(ModelNotFoundError, match="does not exist"):
            resolve_model_path(missing)
    with pytest.raises(ModelNotFoundError, match="non-empty string"):
        resolve_model_path("  ")


def _writer(calls, delay=0.0):
    def build(path):
        calls.append(path)
        time.sleep(delay)
        (path / "config.json").write_text(json.dumps({"n": len(calls)}))
        (path / "model.safetensors").write_bytes(b"x")
    return build


def test_embedded_builds_once_and_is_cached(tmp_path):
    calls = []
    register_embedded_model("deepinfer/tiny-test", _writer(calls))
    assert embedded_model_names() == ["deepinfer/tiny-test"]
    first = resolve_model_path("deepinfer/tiny-test")
    second = resolve_model_path("deepinfer/tiny-test")
    assert first == second == tmp_path / "deepinfer-cache" / "deepinfer--tiny-test"
    assert len(calls) == 1 and calls[0] != first  # built in a temp dir, then renamed
    assert json.loads((first / "config.json").read_text()) == {"n": 1}
    assert sorted(p.name for p in first.parent.iterdir()) == ["deepinfer--tiny-test"]  # no temp leftovers
    # A new version is a new cache entry.
    register_embedded_model("deepinfer/tiny-test", _writer(calls), version="2")
    assert resolve_model_path("deepinfer/tiny-test").name == "deepinfer--tiny-test@2" and len(calls) == 2


def test_embedded_concurrent_resolves_build_once():
    calls = []
    register_embedded_model("deepinfer/tiny-race", _writer(calls, delay=0.2))
    results = []
    threads = [threading.Thread(target=lambda: results.append(resolve_model_path("deepinfer/tiny-race"))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(set(results)) == 1 and len(results) == 4


def test_embedded_lost_race_to_other_process(tmp_path):
    """Another process renames its build into place while ours runs: keep theirs."""
    final = tmp_path / "deepinfer-cache" / "deepinfer--tiny-other"

    def build(path):
        final.mkdir()
        (final / "config.json").write_text('{"by": "other"}')
        (path / "config.json").write_text('{"by": "us"}')

    register_embedded_model("deepinfer/tiny-other", build)
    assert resolve_model_path("deepinfer/tiny-other") == final
    assert json.loads((final / "config.json").read_text()) == {"by": "other"}
    assert sorted(p.name for p in final.parent.iterdir()) == [final.name]


def test_embedded_failures_leave_nothing(tmp_path):
    def boom(path):
        (path / "partial.bin").write_bytes(b"x")
        raise OSError("disk full")

    register_embedded_model("deepinfer/tiny-bad", boom)
    with pytest.raises(OSError, match="disk full"):
        resolve_model_path("deepinfer/tiny-bad")
    register_embedded_model("deepinfer/tiny-bad", lambda path: None)  # writes nothing
    with pytest.raises(RuntimeError, match="did not write config.json"):
        resolve_model_path("deepinfer/tiny-bad")
    assert list((tmp_path / "deepinfer-cache").iterdir()) == []
    calls = []
    register_embedded_model("deepinfer/tiny-bad", _writer(calls))
    assert (resolve_model_path("deepinfer/tiny-bad") / "config.json").is_file() and len(calls) == 1


def test_embedded_errors(tmp_path):
    with pytest.raises(ModelNotFoundError, match="no embedded model is registered under 'deepinfer/tiny-x'"):
        resolve_model_path("deepinfer/tiny-x")
    with pytest.raises(ValueError, match="must start with 'deepinfer/tiny'"):
        register_embedded_model("other/tiny", lambda p: None)
    with pytest.raises(ValueError, match="may only use"):
        register_embedded_model("deepinfer/tiny x", lambda p: None)
    with pytest.raises(TypeError, match="must be callable"):
        register_embedded_model("deepinfer/tiny-y", "not callable")
    # A half-written directory under the final name (not made by us) is reported, not reused.
    register_embedded_model("deepinfer/tiny-z", lambda p: (p / "config.json").write_text("{}"))
    (tmp_path / "deepinfer-cache" / "deepinfer--tiny-z").mkdir(parents=True)
    with pytest.raises(ModelNotFoundError, match="exists but holds no config.json"):
        resolve_model_path("deepinfer/tiny-z")
