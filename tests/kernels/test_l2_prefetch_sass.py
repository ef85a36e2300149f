"""The L2 prefetch ahead of the weight rings (``deepinfer_nvidia.kernels.l2_prefetch``), checked without a GPU.

- ``prefetch_asm``: the PTX forms and their size rule;
- ``gluon_fp8_gemv.prefetch_distance``: the distance a launch gets (cut to the L2 budget and the program's tiles;
  0 when nothing is left past the ring);
- the machine code (sm_90a, Triton's own ptxas): with ``PREFETCH`` on, the wgmma GEMV asks for tiles
  STAGES-1 .. PREFETCH-1 before ``griddepcontrol.wait`` (ACQBULK) and one tile an iteration inside the K loop; the
  line form is the load/store unit's ``CCTL.E.PF2``, the bulk form the TMA's ``UBLKPF.L2``; the loop keeps its
  copies, wgmma and multiplies; the swap experts' loop gets one request and no spill. Bit-equality of the outputs
  (a prefetch moves no data the kernel reads) is checked on the GPU by ``deepinfer_nvidia/tests/prefetch_check.py``.
"""
from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")
gg = pytest.importorskip("deepinfer_nvidia.kernels.gluon_fp8_gemv")
gp = pytest.importorskip("deepinfer_nvidia.kernels.gluon_swap_pair")

from deepinfer_nvidia.kernels.l2_prefetch import prefetch_asm  # noqa: E402
from deepinfer_nvidia.tests.sass_count import count, missing_tools, opcodes  # noqa: E402


def test_prefetch_asm_forms():
    assert "prefetch.global.L2 [$1]" in prefetch_asm(0)
    assert "cp.async.bulk.prefetch.L2.global [$1], 64;" in prefetch_asm(64)
    for bad in (-16, 8, 40):
        with pytest.raises(ValueError, match="multiples of 16"):
            prefetch_asm(bad)


@pytest.mark.parametrize("want,stages,programs,k_tiles,expect", [
    (6, 3, 512, 10, 6),      # wq_b at one row: 512 x 4 x 8 KB = 16.8 MB fits 24 MB
    (8, 3, 800, 24, 5),      # cut to the budget: 800 x 3 x 8 KB = 19.7 MB
    (8, 3, 64, 4, 4),        # cut to the program's 4 tiles
    (6, 3, 10, 2, 0),        # two tiles: the ring holds them, nothing to ask
    (2, 3, 10, 20, 0),       # a distance inside the ring is none
    (6, 3, 1 << 20, 20, 0),  # a launch too wide for the budget at any distance
])
def test_prefetch_distance(want, stages, programs, k_tiles, expect):
    got = gg.prefetch_distance(want, stages, programs, k_tiles)
    assert got == expect
    if got:
        assert programs * (got - stages + 1) * 8192 <= gg.GEMV_L2_BUDGET


def test_launch_plan_carries_the_distance():
    """``launch_plan``: V4.1's wq_b + indexer wq_b at one row on 132 SMs is 576 tiles, one split of 10 K tiles; the
    distance asked for is kept (576 x 4 x 8 KB fits the budget) and 0 asks for none."""
    assert gg.launch_plan(1, 36864, 1280, 132, 3, prefetch=6) == (576, 8, 1280, 1, 6)
    assert gg.launch_plan(1, 36864, 1280, 132, 3, prefetch=0)[4] == 0
    tiles, _, k_per, split, dist = gg.launch_plan(1, 5120, 8192, 132, 3, prefetch=8)
    assert split * k_per >= 8192 and dist == gg.prefetch_distance(8, 3, tiles * split, k_per // 128)


if missing_tools(gg) or not gp._GLUON:
    pytestmark = pytest.mark.skip(reason=missing_tools(gg) or "no Gluon")

SIG = {"x_ptr": "*bf16", "q_ptr": "*u8", "s_ptr": "*u8", "y_ptr": "*bf16", "part_ptr": "*fp32", "cnt_ptr": "*i32",
       "M": "i32", "N": "i32", "K": "i32", "stride_x": "i32", "s_cols": "i32", "NG": "i32", "k_per_split": "i32"}
GEMV = {"BN_BLK": 32, "BK_BLK": 32, "SPLIT": 4, "BLOCK_M": 8, "STAGES": 3, "SAFE": 0, "TMA": 0, "q_desc": None,
        "num_warps": 4, "SWIZZLE": 1, "PDL": 1}
DIV16 = frozenset({"N", "K", "stride_x", "k_per_split"})


@pytest.mark.parametrize("line,op", [(1, "CCTL.E.PF2"), (0, "UBLKPF.L2")])
def test_gemv_asks_before_the_wait_and_once_an_iteration(line, op):
    plain = count(gg._wgmma_gemv_kernel, SIG, {**GEMV, "PREFETCH": 0}, warps=4, div16=DIV16)
    pf = count(gg._wgmma_gemv_kernel, SIG, {**GEMV, "PREFETCH": 6, "PF_LINE": line}, warps=4, div16=DIV16)
    ops, loop = opcodes(pf["sass"]), opcodes(pf["loop"])
    assert op not in opcodes(plain["sass"])
    wait = ops.index("ACQBULK")
    assert ops[:wait].count(op) == 6 - (GEMV["STAGES"] - 1), ops[:wait]  # tiles 2..5, before the wait
    assert loop.count(op) == 1, loop
    for o in ("HGMMA", "LDGSTS", "HMUL2"):
        assert sum(v for k, v in pf["ops"].items() if k.startswith(o)) == \
            sum(v for k, v in plain["ops"].items() if k.startswith(o)), o
    assert len(pf["loop"]) <= len(plain["loop"]) + 24


SWAP_SIG = {"x_ptr": "*bf16", "pair_ptr": "*i32", "bexp_ptr": "*i32", "wa_ptr": "*u8", "sa_ptr": "*i32",
            "wb_ptr": "*u8", "sb_ptr": "*i32", "wt_ptr": "*fp32", "out_ptr": "*bf16", "P": "i32", "E": "i32", "N": "i32",
            "K": "i32", "row_bytes": "i32", "stride_x": "i32", "limit": "fp32", "NT": "i32"}


@pytest.mark.parametrize("up", [1, 0])
def test_swap_loop_asks_once_a_step_without_spilling(up):
    consts = {"TOPK": 6, "UP": up, "BLOCK_M": gp.PAIR_BLOCK_M, "STAGES": 3, "SAFE": 0, "PDL": 1, "SKIP_PAD": 1 - up,
              "KT_PAD": 32, "num_warps": 8, "PREFETCH": 6, "PF_LINE": 1}
    sig = dict(SWAP_SIG, out_ptr="*bf16" if up else "*fp32")
    r = count(gp._swap_pair_kernel, sig, consts, warps=8, div16=frozenset({"N", "K", "row_bytes", "stride_x"}),
              maxnreg=gp.PAIR_MAXNREG)
    loop = opcodes(r["loop"])
    assert loop.count("CCTL.E.PF2") == 1, loop
    assert not any(o.startswith(("STL", "LDL")) for o in loop), "a spill in the K loop"
    ops = opcodes(r["sass"])
    assert ops.index("ACQBULK") < ops.index("CCTL.E.PF2"), "a routed expert's weights asked for before the wait"
