"""Static checks of the swap-AB wgmma FP8 GEMV's machine code (``gluon_fp8_gemv``), no GPU needed: the
installed Triton compiles it for sm_90a and ``deepinfer_nvidia.tests.sass_count`` finds the main loop. Asserted:
the e4m3 tile moves as 16-byte ``cp.async``; 8 ``wgmma`` (``HGMMA.64xN``) per 128-column tile with the 8 or 16
activation rows as N; the decoded tile never goes through shared memory (the registers are the A fragment);
fewer than 5 instructions per weight byte (the CUDA-core GEMV: 6.0 at [32, 32] blocks); constexpr scale blocks,
so no integer division in the loop."""
from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")
gg = pytest.importorskip("deepinfer_nvidia.kernels.gluon_fp8_gemv")

from deepinfer_nvidia.tests.sass_count import count, missing_tools, opcodes  # noqa: E402

if missing_tools(gg):
    pytest.skip(missing_tools(gg), allow_module_level=True)

SIG = {"x_ptr": "*bf16", "q_ptr": "*u8", "s_ptr": "*u8", "y_ptr": "*bf16", "part_ptr": "*fp32", "cnt_ptr": "*i32",
       "M": "i32", "N": "i32", "K": "i32", "stride_x": "i32", "s_cols": "i32", "NG": "i32", "k_per_split": "i32"}


@pytest.mark.parametrize("split,block_m,blk,safe", [(4, 8, 32, 0), (4, 16, 128, 0), (2, 8, 32, 1)])
def test_loop(split, block_m, blk, safe):
    consts = {"BN_BLK": blk, "BK_BLK": blk, "SPLIT": split, "BLOCK_M": block_m, "STAGES": 3, "SAFE": safe,
              "PDL": 0, "TMA": 0, "q_desc": None, "num_warps": 4, "SWIZZLE": int(gg.GEMV_SWIZZLE)}
    r = count(gg._wgmma_gemv_kernel, SIG, consts, warps=4, div16=frozenset({"N", "K", "stride_x", "k_per_split"}))
    ops, n = r["ops"], len(r["loop"])

    def has(prefix):
        return sum(v for k, v in ops.items() if k.startswith(prefix))

    assert has(f"HGMMA.64x{block_m}x16") == 8, ops
    assert has("LDGSTS") and all(".128" in k for k in ops if k.startswith("LDGSTS.E.BYPASS")), ops
    assert has("STS") == 0, ("the decoded tile went through shared memory", ops)
    assert has("HMUL2") == 32 * (2 if safe else 1), ops
    assert not has("I2F") and not has("MUFU"), ("an integer division in the loop", ops)
    assert n / 64 < (5.0 if not safe else 5.6), (n / 64, ops)


def test_thirty_two_rows():
    """BLOCK_M 32 (``DEEPINFER_NV_WGMMA_GEMV_ROWS=32``): the same loop with 32 activation rows as the wgmma's N,
    8 ``HGMMA.64x32x16`` a tile, 16 four-byte activation gathers a thread, no spill (Triton 3.6: 334 loop
    instructions against 305 at 16 rows)."""
    consts = {"BN_BLK": 128, "BK_BLK": 128, "SPLIT": 4, "BLOCK_M": 32, "STAGES": 3, "SAFE": 0, "PDL": 1, "TMA": 0,
              "q_desc": None, "num_warps": 4, "SWIZZLE": int(gg.GEMV_SWIZZLE)}
    r = count(gg._wgmma_gemv_kernel, SIG, consts, warps=4, div16=frozenset({"N", "K", "stride_x", "k_per_split"}))
    ops = r["ops"]
    assert ops.get("HGMMA.64x32x16.F32.BF16", 0) == 8, ops
    assert ops.get("LDGSTS.E", 0) == 16 and ops.get("LDGSTS.E.BYPASS.128", 0) == 4, ops
    every = opcodes(r["sass"])
    assert not any(o.startswith(("STL", "LDL")) for o in every), "a spill"
    assert len(r["loop"]) < 1.2 * 305, len(r["loop"])


def test_programmatic_dependent_launch_orders_the_prologue():
    """With PDL the kernel waits for the previous kernel (``griddepcontrol.wait``: ACQBULK) after requesting
    the first weight tiles (16-byte copies) and before any activation copy (the 4-byte gathers) or store, and
    lets the next kernel launch (PREEXIT) after its K loop; the loop does the same work. Without PDL neither
    instruction is emitted."""
    consts = {"BN_BLK": 32, "BK_BLK": 32, "SPLIT": 4, "BLOCK_M": 8, "STAGES": 3, "SAFE": 0, "TMA": 0,
              "q_desc": None, "num_warps": 4, "SWIZZLE": int(gg.GEMV_SWIZZLE)}
    div16 = frozenset({"N", "K", "stride_x", "k_per_split"})
    plain = count(gg._wgmma_gemv_kernel, SIG, {**consts, "PDL": 0}, warps=4, div16=div16)
    pdl = count(gg._wgmma_gemv_kernel, SIG, {**consts, "PDL": 1}, warps=4, div16=div16)

    assert not {"ACQBULK", "PREEXIT"} & set(opcodes(plain["sass"]))
    ops = opcodes(pdl["sass"])
    assert ops.count("ACQBULK") == 1 and ops.count("PREEXIT") == 1, [o for o in ops if o in ("ACQBULK", "PREEXIT")]
    wait, release = ops.index("ACQBULK"), ops.index("PREEXIT")
    weights_before = [i for i, o in enumerate(ops[:wait]) if o == "LDGSTS.E.BYPASS.128"]
    assert len(weights_before) == (consts["STAGES"] - 1) * 4, ops[:wait]  # the prologue's weight tiles
    assert all(i > wait for i, o in enumerate(ops) if o == "LDGSTS.E"), "an activation copy before the wait"
    assert all(i > wait for i, o in enumerate(ops) if o.startswith(("STG", "RED", "ATOM"))), "a store before the wait"
    loop_end = max(i for i, o in enumerate(ops) if o.startswith("HGMMA"))
    assert release > loop_end, "the next kernel released before the K loop ends"
    # the K loop does the same work (register allocation may move a few instructions: 283 -> 291 on Triton 3.6)
    for op in ("HGMMA", "LDGSTS", "HMUL2"):
        assert sum(v for k, v in pdl["ops"].items() if k.startswith(op)) == \
            sum(v for k, v in plain["ops"].items() if k.startswith(op)), op
    assert abs(len(pdl["loop"]) - len(plain["loop"])) <= 0.05 * len(plain["loop"])


def test_early_release_lets_the_next_kernel_launch_after_the_wait():
    """``PDL=2`` (``GEMV_EARLY_RELEASE``): the same prologue and wait, then PREEXIT straight after ACQBULK, before
    any activation copy, wgmma or store; the K loop does the same work as under ``PDL=1``."""
    consts = {"BN_BLK": 32, "BK_BLK": 32, "SPLIT": 4, "BLOCK_M": 8, "STAGES": 3, "SAFE": 0, "TMA": 0,
              "q_desc": None, "num_warps": 4, "SWIZZLE": int(gg.GEMV_SWIZZLE)}
    div16 = frozenset({"N", "K", "stride_x", "k_per_split"})
    late = count(gg._wgmma_gemv_kernel, SIG, {**consts, "PDL": 1}, warps=4, div16=div16)
    early = count(gg._wgmma_gemv_kernel, SIG, {**consts, "PDL": 2}, warps=4, div16=div16)
    ops = opcodes(early["sass"])
    assert ops.count("ACQBULK") == 1 and ops.count("PREEXIT") == 1, [o for o in ops if o in ("ACQBULK", "PREEXIT")]
    wait, release = ops.index("ACQBULK"), ops.index("PREEXIT")
    assert wait < release, "released before the wait"
    first_after = min(i for i, o in enumerate(ops) if o == "LDGSTS.E" or o.startswith(("HGMMA", "STG", "RED", "ATOM")))
    assert wait < release < first_after, "the release comes after the K loop's work began"
    assert len([o for o in ops[:wait] if o == "LDGSTS.E.BYPASS.128"]) == (consts["STAGES"] - 1) * 4
    for op in ("HGMMA", "LDGSTS", "HMUL2"):
        assert sum(v for k, v in early["ops"].items() if k.startswith(op)) == \
            sum(v for k, v in late["ops"].items() if k.startswith(op)), op
    assert abs(len(early["loop"]) - len(late["loop"])) <= 0.05 * len(late["loop"])


@pytest.mark.parametrize("pdl", [0, 1])
def test_tma_weight_tiles(pdl):
    """``TMA=1``: the weight tiles move by TMA (``UTMALDG.3D``: STAGES-1 in the prologue, one in the loop) into the
    cp.async ring's bytes, so the fragment reads, HGMMA and scale multiplies are the plain kernel's and the 16-byte
    weight copies are gone (the activations keep their 4-byte gathers); the loop waits on the stage's mbarrier.
    With PDL the prologue's TMA requests come before the wait for the previous kernel and every activation copy
    after it."""
    desc = f"tensordesc<u8[64,4,32],{gg._layout.weight_desc_layout()!r}>"
    consts = {"BN_BLK": 128, "BK_BLK": 128, "SPLIT": 2, "BLOCK_M": 8, "STAGES": 3, "SAFE": 0, "PDL": pdl,
              "num_warps": 4, "SWIZZLE": 0}  # the TMA boxes are unswizzled
    div16 = frozenset({"N", "K", "stride_x", "k_per_split"})
    plain = count(gg._wgmma_gemv_kernel, SIG, {**consts, "TMA": 0, "q_desc": None}, warps=4, div16=div16)
    tma = count(gg._wgmma_gemv_kernel, {**SIG, "q_desc": desc}, {**consts, "TMA": 1}, warps=4, div16=div16)
    ops, base = opcodes(tma["sass"]), opcodes(plain["sass"])
    assert ops.count("UTMALDG.3D") == consts["STAGES"] and "UTMALDG.3D" not in base
    assert ops.count("LDGSTS.E.BYPASS.128") == 0 < base.count("LDGSTS.E.BYPASS.128")
    assert ops.count("LDGSTS.E") == base.count("LDGSTS.E") > 0  # the activation gathers
    for op in ("HGMMA.64x8x16.F32.BF16", "HMUL2", "LDS.128"):
        assert ops.count(op) == base.count(op), (op, ops.count(op), base.count(op))
    assert "SYNCS.PHASECHK.TRANS64.TRYWAIT" in ops
    if pdl:
        wait = ops.index("ACQBULK")
        assert [o for o in ops[:wait] if o == "UTMALDG.3D"] == ["UTMALDG.3D"] * (consts["STAGES"] - 1), ops[:wait]
        assert all(i > wait for i, o in enumerate(ops) if o == "LDGSTS.E"), "an activation copy before the wait"


@pytest.mark.parametrize("pdl", [0, 1])
def test_swizzled_ring_reads_the_same_fragments(pdl):
    """``SWIZZLE=1`` (``GEMV_SWIZZLE``): the ring's [64, 128] rows with XOR-swizzled 16-byte chunks. The loop keeps
    4 fragment reads (LDS.128) and its copies, wgmma and multiplies; the two 16-byte halves of a thread's 32 bytes
    sit at row-dependent offsets, so they come from two base registers instead of one and +16 (Triton 3.6: 283 ->
    285 loop instructions)."""
    consts = {"BN_BLK": 32, "BK_BLK": 32, "SPLIT": 2, "BLOCK_M": 8, "STAGES": 3, "SAFE": 0, "PDL": pdl, "TMA": 0,
              "q_desc": None, "num_warps": 4}
    div16 = frozenset({"N", "K", "stride_x", "k_per_split"})
    plain = count(gg._wgmma_gemv_kernel, SIG, {**consts, "SWIZZLE": 0}, warps=4, div16=div16)
    swz = count(gg._wgmma_gemv_kernel, SIG, {**consts, "SWIZZLE": 1}, warps=4, div16=div16)
    for op in ("LDS.128", "LDGSTS.E.BYPASS.128", "LDGSTS.E", "HGMMA.64x8x16.F32.BF16", "HMUL2", "STS"):
        assert swz["ops"].get(op, 0) == plain["ops"].get(op, 0), (op, swz["ops"], plain["ops"])
    assert len(swz["loop"]) <= 1.03 * len(plain["loop"]), (len(swz["loop"]), len(plain["loop"]))

    def bases(r):
        return {line.split("[")[1].split("]")[0].split("+")[0] for line in r["loop"] if "LDS.128" in line}

    assert len(bases(plain)) == 1 and len(bases(swz)) == 2, (bases(plain), bases(swz))
