"""``deepinfer_nvidia.tests.with_knob``: device passes run a script with a kernel module's knob set first."""
from __future__ import annotations

import pytest

pytest.importorskip("triton")


def test_knob_is_set_before_the_script_runs_and_typos_fail(tmp_path):
    from deepinfer_nvidia.kernels import triton_moe
    from deepinfer_nvidia.tests.with_knob import main

    script = tmp_path / "probe.py"
    out = tmp_path / "seen.txt"
    script.write_text("import sys\nfrom deepinfer_nvidia.kernels import triton_moe\n"
                      "open(sys.argv[1], 'w').write(repr((triton_moe.FP8_GROUPED, triton_moe.FP8_LOOP_PAIRS)))\n")
    before = (triton_moe.FP8_GROUPED, triton_moe.FP8_LOOP_PAIRS)
    try:
        main(["triton_moe.FP8_GROUPED=True", "triton_moe.FP8_LOOP_PAIRS=64", "--", str(script), str(out)])
        assert out.read_text() == "(True, 64)"
        with pytest.raises(SystemExit, match="has no knob 'FP8_GROUPD'"):
            main(["triton_moe.FP8_GROUPD=True", "--", str(script), str(out)])
        with pytest.raises(SystemExit, match="MODULE.NAME=VALUE"):
            main(["FP8_GROUPED", "--", str(script), str(out)])
    finally:
        triton_moe.FP8_GROUPED, triton_moe.FP8_LOOP_PAIRS = before
