"""The thirtieth pass's fused kernels compile for sm_90a, no GPU needed, at the launches their modules make.

- The mHC boundary (``triton_mhc_fused``: ``PROJ_WARPS`` warps, ``PROJ_STAGES`` stages, ``BLOCK_D`` columns a
  stream, n 4, 24 mix rows): no register spills (no local loads or stores), the bf16-pieces projection on the
  tensor cores (HMMA), and the PDL wait before the release, both before the first global access.
- ``attention.sparse_sink_rope`` (``triton_attention``: q's RoPE at load, the output's inverse RoPE in the split
  merge): the attention kernel keeps its register count (within 16) and its tensor-core products with the
  rotation, the merge stays below the register cap (Triton 3.6: 168 against the plain merge's 176 at 32 splits;
  3.9: 211 against 168). Their local loads and stores are libdevice's sin / cos slow path for huge arguments (the plain
  ``_rope_kernel`` has 20 too), never taken: angles are reduced modulo 2 pi in fp64 first.

Values: ``test_triton_mhc_fused_interp.py``, ``test_triton_attention_interp.py`` (interpreter) and
``deepinfer_nvidia/tests/test_conformance_mhc_fused.py``, ``test_conformance_attention_rope.py`` (device)."""
from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")
fz = pytest.importorskip("deepinfer_nvidia.kernels.triton_mhc_fused")
ta = pytest.importorskip("deepinfer_nvidia.kernels.triton_attention")

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
@pytest.mark.parametrize("whole_row", [False, True])
def test_gate_norm_kernel(block, whole_row):
    """The default launch (``gate_launch``: one warp, the row in pieces) and the whole row in registers
    (``gate_warps`` warps) both keep to their registers."""
    warps, chunk = (fz.gate_warps(block), block) if whole_row else fz.gate_launch(block)
    consts = {"NR": 32, "NP": 4, "SPLITS": 64, "BLOCK": block, "CHUNK": chunk, "HAS_CPRE": 1, "PDL": 1}
    _no_spills_and_pdl_first(opcodes(count(fz._gate_norm_kernel, GATE_SIG, consts, warps=warps)["sass"]))


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
