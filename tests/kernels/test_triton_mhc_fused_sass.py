"""The fused mHC boundary's kernels (``triton_mhc_fused``) compile for sm_90a, no GPU needed, at the launch the
module makes (``PROJ_WARPS`` warps, ``PROJ_STAGES`` stages, ``BLOCK_D`` columns a stream, n 4, 24 mix rows): no
register spills (no local loads or stores), the bf16-pieces projection on the tensor cores (HMMA), and the PDL
wait before the release, both before the first global access. Values: ``test_triton_mhc_fused_interp.py``
(interpreter) and ``deepinfer_nvidia/tests/test_conformance_mhc_fused.py`` (device)."""
from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")
fz = pytest.importorskip("deepinfer_nvidia.kernels.triton_mhc_fused")

from deepinfer_nvidia.tests.sass_count import count, missing_tools, opcodes  # noqa: E402

if missing_tools(fz):
    pytest.skip(missing_tools(fz), allow_module_level=True)

PROJ_SIG = {"r_ptr": "*bf16", "y_ptr": "*bf16", "post_ptr": "*fp32", "comb_ptr": "*fp32", "out_ptr": "*bf16",
            "fn_ptr": "*fp32", "part_ptr": "*fp32", "ss_ptr": "*fp32", "T": "i32", "D": "i32", "R": "i32",
            "d_per": "i32"}
GATE_SIG = {"part_ptr": "*fp32", "ss_ptr": "*fp32", "base_ptr": "*fp32", "scale_ptr": "*fp32", "pre_ptr": "*fp32",
            "post_ptr": "*fp32", "comb_ptr": "*fp32", "r_ptr": "*bf16", "cpre_ptr": "*fp32", "w_ptr": "*fp32",
            "h_ptr": "*bf16", "T": "i32", "D": "i32", "n": "i32", "norm_eps": "fp32", "hc_eps": "fp32", "iters": "i32",
            "rms_eps": "fp32"}


def _no_spills_and_pdl_first(ops: list[str]) -> None:
    assert not [o for o in ops if o.startswith(("LDL", "STL"))], "register spills"
    assert ops.count("ACQBULK") == 1 and ops.count("PREEXIT") == 1
    first_access = min(i for i, o in enumerate(ops) if o.startswith(("LDG", "STG", "LD.", "ST.")))
    assert ops.index("ACQBULK") < ops.index("PREEXIT") < first_access


@pytest.mark.parametrize("expand", [1, 0])
@pytest.mark.parametrize("split_fn", [1, 0])
def test_expand_proj_kernel(expand, split_fn):
    consts = {"N": 4, "NR": 32, "BLOCK_T": fz.BLOCK_T, "BLOCK_D": fz.BLOCK_D, "EXPAND": expand, "SPLIT_FN": split_fn,
              "PDL": 1}
    ops = opcodes(count(fz._expand_proj_kernel, PROJ_SIG, consts, warps=fz.PROJ_WARPS, stages=fz.PROJ_STAGES)["sass"])
    _no_spills_and_pdl_first(ops)
    hmma = [o for o in ops if o.startswith("HMMA")]
    assert (len(hmma) > 0) == bool(split_fn), hmma[:4]  # fp32 operands take the ieee dot on the CUDA cores
    assert ("STG.E.U16" in ops) == bool(expand)  # the new streams are stored only when expanding


@pytest.mark.parametrize("block", [4096, 8192, 16384])  # V4's D 4096, V4.1's 5120, the widest covered
def test_gate_norm_kernel(block):
    consts = {"NR": 32, "NP": 4, "SPLITS": 64, "BLOCK": block, "HAS_CPRE": 1, "PDL": 1}
    _no_spills_and_pdl_first(opcodes(count(fz._gate_norm_kernel, GATE_SIG, consts, warps=fz.gate_warps(block))["sass"]))
