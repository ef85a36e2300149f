"""RMSNorm's programmatic-dependent-launch release (``triton_norm._rms_kernel`` with ``RELEASE``), checked in its
sm_90a machine code without a GPU: with RELEASE the kernel executes ``griddepcontrol.launch_dependents``
(PREEXIT) before it loads anything, so a following kernel launched with PDL (the wgmma GEMV) can start requesting
its weights while the norm runs; without it the instruction is absent. The norm's own numerics are the device
conformance harness's (``deepinfer_nvidia/tests/test_conformance.py``)."""
from __future__ import annotations

import re

import pytest

triton = pytest.importorskip("triton")
tn = pytest.importorskip("deepinfer_nvidia.kernels.triton_norm")

from deepinfer_nvidia.tests.sass_count import count, missing_tools  # noqa: E402

if missing_tools(tn):
    pytest.skip(missing_tools(tn), allow_module_level=True)

SIG = {"x_ptr": "*bf16", "w_ptr": "*bf16", "y_ptr": "*bf16", "n_rows": "i32", "n_cols": "i32", "eps": "fp32"}


def _opcodes(release: int) -> list[str]:
    consts = {"HAS_W": 1, "ROWS": 2, "BLOCK": 4096, "RELEASE": release}
    sass = count(tn._rms_kernel, SIG, consts, warps=8)["sass"]
    return [re.sub(r"^\s+/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?", "", line).split()[0]
            for line in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/", line)]


def test_release_comes_before_the_first_load():
    assert "PREEXIT" not in _opcodes(0)
    ops = _opcodes(1)
    assert ops.count("PREEXIT") == 1, ops
    first_load = min(i for i, o in enumerate(ops) if o.startswith("LDG"))
    assert ops.index("PREEXIT") < first_load, ops[:first_load + 1]
