"""Static checks of the Gluon swap-AB expert kernels' machine code (``gluon_moe_swap``), no GPU needed.

The installed Triton compiles them for sm_90a (its wheel ships ``ptxas`` and ``nvdisasm``) and
``deepinfer_nvidia.tests.sass_count`` finds the main loop. What the H200 runs well depends on properties that a
refactor could silently lose (docs/performance.md, eleventh pass), so they are asserted here:
- the packed weight rows move as 16-byte ``cp.async`` (``LDGSTS...128``), never 8-byte ones (the first version's
  2x loss);
- the loop issues ``wgmma`` (``HGMMA``) with 16 pairs as N;
- with the fragment decode (``AREG=2``) the decoded tile never goes through shared memory (no ``STS`` in the
  loop) and the loop stays under 4 instructions per weight element (up kernel) / 4.5 (down kernel);
- every mode compiles (both decodes, A through shared memory, through a conversion, in the fragment).
"""
from __future__ import annotations

import re
from collections import Counter

import pytest

triton = pytest.importorskip("triton")
gms = pytest.importorskip("deepinfer_nvidia.kernels.gluon_moe_swap")

from deepinfer_nvidia.tests.sass_count import count, missing_tools, opcodes  # noqa: E402

if missing_tools(gms):
    pytest.skip(missing_tools(gms), allow_module_level=True)

SIG = {"x_ptr": "*bf16", "pair_ptr": "*i32", "bexp_ptr": "*i32", "wa_ptr": "*u8", "sa_ptr": "*u8", "wb_ptr": "*u8",
       "sb_ptr": "*u8", "wt_ptr": "*fp32", "out_ptr": "*bf16", "P": "i32", "E": "i32", "N": "i32", "K": "i32",
       "part_ptr": "*fp32", "cnt_ptr": "*i32", "row_bytes": "i32", "stride_x": "i32", "limit": "fp32", "NT": "i32",
       "R": "i32", "TPS": "i32"}


def _desc_type(block_n: int = 64, block_k: int = 128) -> str:
    """The type string of a TMA weight descriptor argument (uint8 boxes [block_n, block_k/32, 16])."""
    from deepinfer_nvidia.kernels.gluon_swap_layout import weight_desc_layout

    lay = weight_desc_layout()
    return f"tensordesc<u8[{block_n},{block_k // 32},16],{lay!r}>"


def _compile(up: int, areg: int, safe: int, block_m: int = 16, stages: int = 3, split: int = 1, tma: int = 0,
             pdl: int = 0, skip_pad: int = 0, scales_smem: int = 0, kt_pad: int = 1):
    sig = dict(SIG, out_ptr="*bf16" if up else "*fp32")
    if scales_smem:  # the scale stacks as int32 words
        sig.update(sa_ptr="*i32", sb_ptr="*i32")
    consts = {"TOPK": 6, "UP": up, "BLOCK_M": block_m, "BLOCK_N": 64, "BLOCK_K": 128, "STAGES": stages, "SAFE": safe,
              "AREG": areg, "PROBE": 0, "SPLIT": split, "TMA": tma, "num_warps": 4, "PDL": pdl,
              "SKIP_PAD": skip_pad,
              "SCALES_SMEM": scales_smem, "KT_PAD": kt_pad}
    if tma:
        sig.update(wa_desc=_desc_type(), wb_desc=_desc_type())
    else:
        consts.update(wa_desc=None, wb_desc=None)
    return count(gms._swap_kernel, sig, consts, warps=4, div16=frozenset({"N", "K", "row_bytes", "stride_x"}))


def _has(ops, prefix):
    return sum(v for k, v in ops.items() if k.startswith(prefix))


@pytest.mark.parametrize("up", [1, 0])
def test_fragment_decode_loop(up):
    r = _compile(up, areg=2, safe=0)
    ops, n = r["ops"], len(r["loop"])
    elems = 64 * 128 * (2 if up else 1) / 128  # weight elements per thread per iteration
    assert _has(ops, "HGMMA.64x16x16") == 8 * (2 if up else 1), ops
    assert _has(ops, "LDGSTS") and all(".128" in k for k in ops if k.startswith("LDGSTS")), ops
    assert _has(ops, "STS") == 0, ("the decoded tile went through shared memory", ops)
    assert n / elems < (4.0 if up else 4.5), (n / elems, ops)


@pytest.mark.parametrize("areg,safe,block_m", [(0, 1, 16), (1, 0, 32), (2, 1, 64), (0, 0, 128)])
def test_every_mode_compiles(areg, safe, block_m):
    r = _compile(1, areg=areg, safe=safe, block_m=block_m, stages=2 if block_m == 128 else 3)
    assert _has(r["ops"], "HGMMA") and _has(r["ops"], "HMUL2") == 64 * (2 if safe else 1), r["ops"]


@pytest.mark.parametrize("up", [1, 0])
def test_split_k_keeps_the_loop_and_adds_the_arrival_counter(up):
    """With SPLIT > 1 the K loop is the plain kernel's (same HGMMA and 16-byte copies, at most 2% more
    instructions: the split only moves the loop's bounds); the epilogue gains one atomic add (the arrival
    counter) and one exchange (its reset). Without a split neither atomic is emitted."""
    plain, split = _compile(up, areg=2, safe=0), _compile(up, areg=2, safe=0, split=3)
    for name in ("HGMMA.64x16x16", "LDGSTS"):
        assert _has(split["ops"], name) == _has(plain["ops"], name), (name, split["ops"])
    assert len(split["loop"]) <= 1.02 * len(plain["loop"]), (len(split["loop"]), len(plain["loop"]))

    def atomics(r):  # opcodes of the ATOMG lines, predicates (``@P5``) dropped
        return sorted(re.search(r"(ATOMG\S*)", line).group(1) for line in r["sass"].splitlines() if "ATOMG" in line)

    assert atomics(plain) == [] and atomics(split) == ["ATOMG.E.ADD.STRONG.GPU", "ATOMG.E.EXCH.STRONG.GPU"], \
        atomics(split)


@pytest.mark.parametrize("up", [1, 0])
def test_tma_weight_tiles(up):
    """``TMA=1``: the weight tiles move by TMA (``UTMALDG.3D``: one a matrix for each of the STAGES-1 prologue tiles
    and once more in the loop) into the same unswizzled bytes, so the fragment reads (``LDS.128``) and the
    ``HGMMA`` are the cp.async kernel's; only the activation rows stay ``cp.async`` (fewer 16-byte copies); the
    loop waits on the stage's mbarrier (``SYNCS.PHASECHK``). The plain kernel issues no TMA."""
    plain, tma = _compile(up, areg=2, safe=0), _compile(up, areg=2, safe=0, tma=1)

    def n(r, op):
        return len(re.findall(rf"\b{re.escape(op)}\b", r["sass"]))

    mats = 2 if up else 1
    assert n(plain, "UTMALDG.3D") == 0 and n(tma, "UTMALDG.3D") == 3 * mats, n(tma, "UTMALDG.3D")
    for op in ("LDS.128", "HGMMA.64x16x16.F32.BF16"):
        assert n(tma, op) == n(plain, op), (op, n(tma, op), n(plain, op))
    assert 0 < n(tma, "LDGSTS.E.BYPASS.128") < n(plain, "LDGSTS.E.BYPASS.128")
    assert n(tma, "SYNCS.PHASECHK.TRANS64.TRYWAIT") >= 1


@pytest.mark.parametrize("up", [1, 0])
def test_pdl_waits_then_releases_before_any_load(up):
    """Launched with programmatic dependent launch (``triton_pdl``), every program first waits for the previous
    kernel (ACQBULK), then lets the next launch (PREEXIT), before its first load; the loop is unchanged."""
    plain, with_pdl = _compile(up, 2, 1), _compile(up, 2, 1, pdl=1)
    assert not {"ACQBULK", "PREEXIT"} & set(opcodes(plain["sass"]))
    ops = opcodes(with_pdl["sass"])
    first_load = min(i for i, o in enumerate(ops) if o.startswith(("LDG", "LDGSTS")))
    assert ops.count("ACQBULK") == 1 and ops.index("ACQBULK") < ops.index("PREEXIT") < first_load
    assert with_pdl["ops"] == plain["ops"]


def test_down_skip_pad_adds_no_memory_op_to_the_k_loop():
    """``SKIP_PAD`` (``SWAP_DOWN_SKIP_PAD``, the down launch): the padding rows' mask is loop-invariant. The K loop
    keeps the same loads, copies, barriers and wgmma, and grows by at most two instructions a step (the copies'
    predicate: Triton 3.6 adds one ISETP and one SEL to 268; 3.9 allocates differently and ends shorter); the pair
    load is shared with the epilogue's (no extra LDG)."""
    plain, masked = (_compile(0, areg=2, safe=0, skip_pad=v) for v in (0, 1))
    kinds = ("LDG", "LDS", "STS", "HGMMA", "BAR", "DEPBAR", "FENCE", "WARPGROUP")
    a, b = Counter(opcodes(plain["loop"])), Counter(opcodes(masked["loop"]))
    assert {k: v for k, v in a.items() if k.startswith(kinds)} == {k: v for k, v in b.items() if k.startswith(kinds)}
    assert len(masked["loop"]) <= len(plain["loop"]) + 2
    assert _has(masked["ops"], "LDG") == _has(plain["ops"], "LDG")


@pytest.mark.parametrize("up,kt_pad,split", [(1, 64, 1), (0, 32, 1), (1, 16, 3)])
def test_scales_smem_takes_every_global_load_out_of_the_k_loop(up, kt_pad, split):
    """``SCALES_SMEM`` (``SWAP_SCALES_SMEM``): the scale words are loaded once before the loop (32-bit loads), so
    the K loop has no global load left: the default's per-step scale loads (``LDG.E.U8``) become shared loads
    (``LDS``) of the staged words; the copies and the wgmma are unchanged, and the loop gets shorter (Triton 3.6:
    455 -> 439 instructions up, 268 -> 262 down)."""
    plain = _compile(up, areg=2, safe=0, split=split)
    staged = _compile(up, areg=2, safe=0, split=split, scales_smem=1, kt_pad=kt_pad)
    loop_plain, loop_staged = Counter(opcodes(plain["loop"])), Counter(opcodes(staged["loop"]))
    assert _has(loop_plain, "LDG.E.U8") > 0 and _has(loop_staged, "LDG.E") == 0, (loop_plain, loop_staged)
    assert _has(loop_staged, "LDS") > _has(loop_plain, "LDS")
    for kind in ("HGMMA", "LDGSTS", "HMUL2"):
        assert _has(loop_staged, kind) == _has(loop_plain, kind), kind
    assert len(staged["loop"]) < len(plain["loop"])
    whole = Counter(opcodes(staged["sass"]))
    assert _has(whole, "LDG.E.U8") == 0 and _has(whole, "LDG.E") >= (2 if up else 1) * kt_pad * 64 // 128, whole
