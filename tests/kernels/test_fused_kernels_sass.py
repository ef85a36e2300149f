"""The thirtieth pass's fused attention kernels compile for sm_90a, no GPU needed, at the launches their modules make.

- ``attention.sparse_sink_rope`` (``triton_attention``: q's RoPE at load, the output's inverse RoPE in the split
  merge): the attention kernel keeps its register count (within 16) and its tensor-core products with the
  rotation, the merge stays below the register cap (Triton 3.6: 168 against the plain merge's 176 at 32 splits;
  3.9: 211 against 168). Their local loads and stores are libdevice's sin / cos slow path for huge arguments (the plain
  ``_rope_kernel`` has 20 too), never taken: angles are reduced modulo 2 pi in fp64 first.

Values: ``test_triton_attention_interp.py`` (interpreter) and ``deepinfer_nvidia/tests/test_conformance_attention_rope.py``
(device). (The fused mHC boundary kernel once checked here was removed in the thirty-first pass: 3x slower than
its parts on the device.)"""
from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")
ta = pytest.importorskip("deepinfer_nvidia.kernels.triton_attention")

from deepinfer_nvidia.tests.sass_count import count, missing_tools, opcodes  # noqa: E402

if missing_tools(ta):
    pytest.skip(missing_tools(ta), allow_module_level=True)

ATTN_SIG = {"q_ptr": "*bf16", "kva_ptr": "*bf16", "idxa_ptr": "*i64", "kvb_ptr": "*bf16", "idxb_ptr": "*i64",
            "sink_ptr": "*fp32", "o_ptr": "*fp32", "ml_ptr": "*fp32", "H": "i32", "D": "i32", "Na": "i32", "Nb": "i32",
            "qk_scale": "fp32", "per_split": "i32", "pos_ptr": "*i64", "f_ptr": "*fp32"}
MERGE_SIG = {"part_ptr": "*fp32", "ml_ptr": "*fp32", "o_ptr": "*bf16", "T": "i32", "H": "i32", "D": "i32",
             "pos_ptr": "*i64", "f_ptr": "*fp32"}


def _pdl_first(ops: list[str]) -> None:
    first_access = min(i for i, o in enumerate(ops) if o.startswith(("LDG", "STG", "LD.", "ST.")))
    assert ops.index("ACQBULK") < ops.index("PREEXIT") < first_access


def test_attention_with_q_rope_keeps_its_registers():
    """The batch-1 launch (16 heads, 16-slot chunks, 32 splits, 512 dims, 8 warps)."""
    consts = {"HAS_B": 1, "SPLITS": 32, "BLOCK_H": 16, "BLOCK_N": 16, "BLOCK_D": 512, "PDL": 1, "HALF": 32,
              "PREC": "tf32"}
    plain = count(ta._attn_kernel, ATTN_SIG, dict(consts, ROPE_Q=0), warps=8)
    roped = count(ta._attn_kernel, ATTN_SIG, dict(consts, ROPE_Q=1), warps=8)
    assert roped["registers"] <= plain["registers"] + 16, (roped["registers"], plain["registers"])
    ops = opcodes(roped["sass"])
    _pdl_first(ops)
    assert [o for o in ops if o.startswith("HMMA")] == [o for o in opcodes(plain["sass"]) if o.startswith("HMMA")]


@pytest.mark.parametrize("splits", [8, 32])
def test_merge_with_output_rope(splits):
    consts = {"SPLITS": splits, "BLOCK_D": 512, "HALF": 32, "PDL": 1}
    plain = count(ta._merge_kernel, MERGE_SIG, dict(consts, ROPE_O=0), warps=4)
    roped = count(ta._merge_kernel, MERGE_SIG, dict(consts, ROPE_O=1), warps=4)
    assert roped["registers"] < 255, (roped["registers"], plain["registers"])  # not at the cap: no spilling
    _pdl_first(opcodes(roped["sass"]))
