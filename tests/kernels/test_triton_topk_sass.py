"""``index.topk``'s select (``triton_topk._topk_kernel``) compiles for sm_90a with its data-dependent bisection
loop, no GPU needed: the early exit (``EARLY_EXIT``: stop at a pass that counts exactly k; no pass for a row with
at most k valid scores) must leave the kernel as it was but for the loop's exit test, with the row held in
registers and streamed. Its values: ``test_triton_topk_interp.py`` (interpreter) and the device file
``deepinfer_nvidia/tests/test_conformance_topk.py``."""
from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")
tt = pytest.importorskip("deepinfer_nvidia.kernels.triton_topk")

from deepinfer_nvidia.tests.sass_count import count, missing_tools, opcodes  # noqa: E402

if missing_tools(tt):
    pytest.skip(missing_tools(tt), allow_module_level=True)

SIG = {"s_ptr": "*fp32", "out_ptr": "*i64", "N": "i32", "K": "i32", "W": "i32", "stride_s": "i32"}


@pytest.mark.parametrize("single,block", [(1, 1024), (0, 8192)])
def test_early_exit_compiles_to_the_same_kernel_and_a_compare(single, block):
    consts = {"BLOCK": block, "SINGLE": single, "BLOCK_K": 512, "BITS": 1, "PDL": 1}
    warps = 4 if block < 4096 else 8
    plain = opcodes(count(tt._topk_kernel, SIG, {**consts, "EARLY": 0}, warps=warps, div16=frozenset())["sass"])
    early = opcodes(count(tt._topk_kernel, SIG, {**consts, "EARLY": 1}, warps=warps, div16=frozenset())["sass"])
    assert "ACQBULK" in early and "BRA" in early
    assert abs(len(early) - len(plain)) <= 0.02 * len(plain), (len(early), len(plain))
