"""``benchmarks/spec_decode.py`` and ``benchmarks/prefix_cache.py`` end to end at tiny sizes on the
CPU, on a checkpoint written by ``sweep.py --arch v41 --tiny --save-checkpoint`` (the layout the
H200 run uses, ``deepinfer_nvidia/tests/slice_engine.sh``): every mode runs, the greedy outputs of
all modes agree where they must, and the printed ratios come from the same run."""
from __future__ import annotations

import json
import re
import sys

import pytest

from benchmarks import prefix_cache, spec_decode, sweep


@pytest.fixture(scope="module")
def slice_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("slice")
    argv = ["sweep.py", "--arch", "v41", "--tiny", "--device", "cpu", "--layers", "7", "--save-checkpoint",
            str(out / "ckpt"), "--save-only", "--out", str(out / "sweep")]
    mp = pytest.MonkeyPatch()
    mp.setattr(sys, "argv", argv)
    try:
        sweep.main()
    finally:
        mp.undo()
    return str(out / "ckpt")


def _main(module, argv, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [module.__name__] + argv)
    module.main()
    return capsys.readouterr().out


def test_spec_decode_benchmark_one_engine_per_mode(slice_dir, tmp_path, monkeypatch, capsys):
    js = tmp_path / "spec.json"
    out = _main(spec_decode, ["--model", slice_dir, "--batches", "1,3", "--max-tokens", "6", "--prompt-len", "12",
                              "--threads", "1", "--async-scheduling", "off", "--json", str(js)], monkeypatch, capsys)
    rows = re.findall(r"^\s+(\d+) (off|dspark\+conf|dspark)\s+([\d.]+)\s+([\d.]+)x.* (yes|NO)$", out, re.M)
    assert len(rows) == 6, out
    assert all(r[4] == "yes" for r in rows), out  # greedy: DSpark on == off, per batch size
    res = json.loads(js.read_text())
    assert set(res) == {f"B{b}/{m}" for b in (1, 3) for m in ("off", "dspark", "dspark+conf")}
    for key, r in res.items():
        assert r["tokens"] == int(key[1:key.index("/")]) * 6  # every request generated max_tokens
        if not key.endswith("/off"):  # counters restart for each measured run (one engine per mode)
            st = r["stats"]
            assert st["num_drafts"] > 0 and st["num_target_steps"] == r["target_steps"]


def test_prefix_cache_benchmark_on_the_slice_layout(slice_dir, monkeypatch, capsys):
    out = _main(prefix_cache, ["--model", slice_dir, "--system-len", "96", "--question-len", "8", "--num-questions",
                               "3", "--num-turns", "3", "--output-len", "4", "--num-prompts", "2",
                               "--accuracy-modes", "bounded", "--workloads", "multi-turn,accuracy"], monkeypatch, capsys)
    rows = re.findall(r"^multi-turn\s+(off|exact|bounded)\s+(\d+)", out, re.M)
    fed = dict(rows)
    assert set(fed) == {"off", "exact", "bounded"}, out
    assert int(fed["exact"]) < int(fed["off"]) and int(fed["bounded"]) < int(fed["off"])  # hits saved tokens
    assert re.search(r"^exact\s", out, re.M) is None and re.search(r"^bounded\s+\d+", out, re.M), out
