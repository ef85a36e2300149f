"""Static checks of the balanced up launch's machine code (``gluon_swap_balanced``), no GPU needed: two programs
still fit an SM, the K loop does not spill, and it is the paired kernel's loop (the segment bounds fold into the
copies' existing comparisons and every loop bound stays uniform, so it is no longer: within 1%)."""
from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")
gb = pytest.importorskip("deepinfer_nvidia.kernels.gluon_swap_balanced")
gp = pytest.importorskip("deepinfer_nvidia.kernels.gluon_swap_pair")
gms = pytest.importorskip("deepinfer_nvidia.kernels.gluon_moe_swap")

from deepinfer_nvidia.tests.sass_count import count, missing_tools, opcodes  # noqa: E402

if missing_tools(gms) or not gp._GLUON:
    pytest.skip(missing_tools(gms) or "no Gluon", allow_module_level=True)

SIG = {"x_ptr": "*bf16", "pair_ptr": "*i32", "bexp_ptr": "*i32", "wa_ptr": "*u8", "sa_ptr": "*i32", "wb_ptr": "*u8",
       "sb_ptr": "*i32", "out_ptr": "*bf16", "part_ptr": "*fp32", "cnt_ptr": "*i32", "P": "i32", "E": "i32",
       "N": "i32", "K": "i32", "row_bytes": "i32", "stride_x": "i32", "limit": "fp32", "NT": "i32", "NB": "i32"}
DIV16 = frozenset({"N", "K", "row_bytes", "stride_x"})


def _balanced(packed: int):
    consts = {"TOPK": 6, "BLOCK_M": gp.PAIR_BLOCK_M, "STAGES": 3, "SAFE": 0, "KT_PAD": 32, "num_warps": 8,
              "PDL": 1, "PACKED": packed}
    return count(gb._balanced_up_kernel, SIG, consts, warps=8, div16=DIV16, maxnreg=gp.PAIR_MAXNREG)


def _paired(packed: int):
    sig = {n: t for n, t in SIG.items() if n not in ("part_ptr", "cnt_ptr", "NB")}
    sig["wt_ptr"] = "*fp32"
    consts = {"TOPK": 6, "UP": 1, "BLOCK_M": gp.PAIR_BLOCK_M, "STAGES": 3, "SAFE": 0, "PDL": 1, "SKIP_PAD": 0,
              "KT_PAD": 32, "num_warps": 8, "PACKED": packed}
    return count(gp._swap_pair_kernel, sig, consts, warps=8, div16=DIV16, maxnreg=gp.PAIR_MAXNREG)


def _k_loop(r) -> list[str]:
    """The K loop: the innermost loop holding the 16 ``HGMMA`` (``count``'s longest loop is the segment loop)."""
    import re

    ins = [x for x in r["sass"].splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/", x)]
    addr = [int(re.match(r"\s+/\*([0-9a-f]+)\*/", x).group(1), 16) for x in ins]
    labels = {}
    lines = r["sass"].splitlines()
    for j, line in enumerate(lines):
        m = re.match(r"\s*(\.L_x_\d+):", line)
        nxt = [x for x in lines[j + 1:j + 5] if re.match(r"\s+/\*[0-9a-f]{4,}\*/", x)] if m else []
        if nxt:
            labels[m.group(1)] = int(re.match(r"\s+/\*([0-9a-f]+)\*/", nxt[0]).group(1), 16)
    best = None
    for line, a in zip(ins, addr):
        m = re.search(r"BRA.*(\.L_x_\d+)", line)
        if m and m.group(1) in labels and labels[m.group(1)] < a:
            body = [x for x, b in zip(ins, addr) if labels[m.group(1)] <= b <= a]
            if sum(o.startswith("HGMMA") for o in opcodes(body)) == 16 and (best is None or len(body) < len(best)):
                best = body
    assert best is not None, "no loop with the 16 HGMMA"
    return best


@pytest.mark.parametrize("packed", [0, 1])
def test_balanced_up_fits_and_keeps_the_paired_loop(packed):
    r, base = _balanced(packed), _paired(packed)
    assert r["registers"] is not None and r["registers"] <= 128, r["registers"]
    assert r["shared"] + 1024 <= 114 * 1024, r["shared"]  # two programs an SM
    loop, ref = _k_loop(r), _k_loop(base)
    assert not {"LDL", "STL"} & {op.split(".")[0] for op in opcodes(loop)}, "the K loop spills registers"
    assert len(loop) <= 1.01 * len(ref), (len(loop), len(ref))
    assert "R2UR" not in {op.split(".")[0] for op in opcodes(loop)}  # every loop bound uniform
