"""Static checks of the two-warpgroup swap experts' machine code (``gluon_swap_pair``), no GPU needed.

The kernel exists to put twice the warps of the one-warpgroup kernel on an SM at 1 token, so what must hold is:
- two programs of 8 warps fit an SM (at most 128 registers a thread: 2 x 256 x 128 = the SM's 65536; at most half
  of the H200's 227 KB of shared memory; the launch caps registers at ``PAIR_MAXNREG``) and nothing in the K loop
  spills to local memory (Triton 3.6, the H200's, needs no spill at all; 3.9 spills 6 outside the loop);
- each warp's K loop is the one-warpgroup kernel's (``gluon_moe_swap`` with the fragment decode): the same
  16-byte copies and fragment reads, ``wgmma`` with N 16 (two 8-pair tiles), no ``STS`` in the loop, and within
  2% of its instruction count;
- with programmatic dependent launch the wait and release come before the first load.
"""
from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")
gp = pytest.importorskip("deepinfer_nvidia.kernels.gluon_swap_pair")
gms = pytest.importorskip("deepinfer_nvidia.kernels.gluon_moe_swap")

from deepinfer_nvidia.tests.sass_count import count, missing_tools, opcodes  # noqa: E402

if missing_tools(gms) or not gp._GLUON:
    pytest.skip(missing_tools(gms) or "no Gluon", allow_module_level=True)

SIG = {"x_ptr": "*bf16", "pair_ptr": "*i32", "bexp_ptr": "*i32", "wa_ptr": "*u8", "sa_ptr": "*i32", "wb_ptr": "*u8",
       "sb_ptr": "*i32", "wt_ptr": "*fp32", "out_ptr": "*bf16", "P": "i32", "E": "i32", "N": "i32", "K": "i32",
       "row_bytes": "i32", "stride_x": "i32", "limit": "fp32", "NT": "i32"}
DIV16 = frozenset({"N", "K", "row_bytes", "stride_x"})


def _pair(up: int, pdl: int = 1, safe: int = 0, stages: int = 3, packed: int = 0):
    consts = {"TOPK": 6, "UP": up, "BLOCK_M": gp.PAIR_BLOCK_M, "STAGES": stages, "SAFE": safe, "PDL": pdl,
              "SKIP_PAD": 1 - up, "KT_PAD": 32, "num_warps": 8, "PACKED": packed}
    return count(gp._swap_pair_kernel, dict(SIG, out_ptr="*bf16" if up else "*fp32"), consts, warps=8, div16=DIV16,
                 maxnreg=gp.PAIR_MAXNREG)


def _single(up: int):
    sig = {n: t for n, t in SIG.items() if n not in ("row_bytes", "stride_x", "limit", "NT")}  # the kernel's order
    sig.update(sa_ptr="*u8", sb_ptr="*u8", part_ptr="*fp32", cnt_ptr="*i32", row_bytes="i32", stride_x="i32",
               limit="fp32", NT="i32", R="i32", TPS="i32", out_ptr="*bf16" if up else "*fp32")
    consts = {"TOPK": 6, "UP": up, "BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "STAGES": 3, "SAFE": 0, "AREG": 2,
              "PROBE": 0, "SPLIT": 1, "TMA": 0, "num_warps": 4, "PDL": 1, "SKIP_PAD": 1 - up, "SCALES_SMEM": 0,
              "KT_PAD": 1, "wa_desc": None, "wb_desc": None}
    return count(gms._swap_kernel, sig, consts, warps=4, div16=DIV16)


def _has(ops, prefix):
    return sum(v for k, v in ops.items() if k.startswith(prefix))


@pytest.mark.parametrize("up,stages", [(1, 3), (0, 3), (1, 4)])
def test_two_programs_fit_an_sm_without_spills(up, stages):
    """Also at 4 stages (``PAIR_STAGES`` override): 112 KB with the scales staged for V4.1's 20 steps (KT_PAD 32),
    so two programs and their 1 KB reservations still fit the SM's 228 KB."""
    r = _pair(up, stages=stages)
    assert r["registers"] is not None and r["registers"] <= 128, r["registers"]
    assert r["shared"] + 1024 <= 114 * 1024, r["shared"]
    assert not {"LDL", "STL"} & {op.split(".")[0] for op in opcodes(r["loop"])}, "the K loop spills registers"


@pytest.mark.parametrize("up", [1, 0])
def test_each_warps_loop_is_the_single_warpgroup_loop(up):
    pair, single = _pair(up), _single(up)
    mats = 2 if up else 1
    assert _has(pair["ops"], "HGMMA.64x16x16") == 8 * mats, pair["ops"]
    assert _has(pair["ops"], "STS") == 0, ("the decoded tile went through shared memory", pair["ops"])
    copies = [k for k in pair["ops"] if k.startswith("LDGSTS")]
    assert copies and all(".128" in k for k in copies), pair["ops"]
    assert _has(pair["ops"], "LDS.128") == _has(single["ops"], "LDS.128"), (pair["ops"], single["ops"])
    assert len(pair["loop"]) <= 1.02 * len(single["loop"]), (len(pair["loop"]), len(single["loop"]))


def test_pdl_waits_then_releases_before_any_load():
    ops = opcodes(_pair(1, pdl=1)["sass"])
    first_load = min(i for i, o in enumerate(ops) if o.startswith(("LDG", "LDGSTS")))
    assert ops.count("ACQBULK") == 1 and ops.index("ACQBULK") < ops.index("PREEXIT") < first_load
    assert not {"ACQBULK", "PREEXIT"} & set(opcodes(_pair(1, pdl=0)["sass"]))


def test_down_launch_asks_for_weights_before_its_wait_only_when_early():
    """``PAIR_EARLY_WEIGHTS`` (``EARLY_W``, the down launch under PDL): the ring's first weight copies (``LDGSTS``)
    and the id, pair and scale loads come before the wait (``ACQBULK``), then the release; without it nothing is
    loaded before the wait, and the K loop is the same length within 2%."""
    def before_wait(early):
        consts = {"TOPK": 6, "UP": 0, "BLOCK_M": gp.PAIR_BLOCK_M, "STAGES": 3, "SAFE": 0, "PDL": 1, "SKIP_PAD": 1,
                  "KT_PAD": 32, "num_warps": 8, "EARLY_W": early}
        r = count(gp._swap_pair_kernel, dict(SIG, out_ptr="*fp32"), consts, warps=8, div16=DIV16,
                  maxnreg=gp.PAIR_MAXNREG)
        ops = opcodes(r["sass"])
        acq = ops.index("ACQBULK")
        assert ops.count("ACQBULK") == 1 and acq < ops.index("PREEXIT")
        return sum(o.startswith("LDGSTS") for o in ops[:acq]), sum(o.startswith("LDG") for o in ops[:acq]), r
    copies, loads, early = before_wait(1)
    assert copies >= 2 and loads > copies, (copies, loads)
    assert before_wait(0)[:2] == (0, 0)
    assert abs(len(early["loop"]) - len(before_wait(0)[2]["loop"])) <= 0.02 * len(early["loop"])


def test_exact_decode_compiles():
    r = _pair(1, safe=1)
    assert _has(r["ops"], "HGMMA") and _has(r["ops"], "HMUL2") == 128, r["ops"]


def test_policy_takes_one_token_only(monkeypatch):
    """``takes``: V4.1's 1-token up launch (216 programs on 132 SMs, under one wave of 3 an SM) goes to two
    warpgroups; 2 tokens (432 programs), a hidden or intermediate width that is not whole 128-column tiles (the
    fragment order's unit), or the switch off do not."""
    assert gp.takes(216, 132, 5120, 2304)
    assert not gp.takes(432, 132, 5120, 2304)
    assert not gp.takes(216, 132, 640, 288) and not gp.takes(216, 132, 5120, 2320)
    monkeypatch.setattr(gp, "PAIR_WARPGROUPS", False)
    assert not gp.takes(216, 132, 5120, 2304)


@pytest.mark.parametrize("up,cut", [(1, 64), (0, 32)])
def test_word_layout_shortens_the_loop_by_its_decode(up, cut):
    """Stacks in core's word layout (``PACKED``): 4 fewer instructions a decoded word (15 against 19: 16 words a
    warp a step up, 8 down), no spill, the same copies, fragment reads and wgmma (Triton 3.6: 433 -> 369 up,
    253 -> 221 down)."""
    plain, words = _pair(up), _pair(up, packed=1)
    assert len(plain["loop"]) - len(words["loop"]) == cut, (len(plain["loop"]), len(words["loop"]))
    assert not {"LDL", "STL"} & {op.split(".")[0] for op in opcodes(words["loop"])}
    for prefix in ("LDGSTS", "LDS", "HGMMA", "HMUL2"):
        assert _has(words["ops"], prefix) == _has(plain["ops"], prefix), prefix
