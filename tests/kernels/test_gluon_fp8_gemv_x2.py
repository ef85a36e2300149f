"""The FP8-``wgmma`` GEMV on split activations (``gluon_fp8_gemv_x2``) without a GPU: the split's host model
(``split_reference``) keeps every element within ``2^-17`` of its 32-column block's largest and exact down to
``2^-10`` of it; the launch plan keeps a step inside its split; and the sm_90a machine code (installed Triton):
the weight tiles move only by TMA into the ring ``wgmma`` reads (no weight byte passes through a thread), two
e4m3 ``wgmma`` a 32-column block, and with PDL the weight boxes are requested before the wait and x after it."""
from __future__ import annotations

import pytest
import torch

gx = pytest.importorskip("deepinfer_nvidia.kernels.gluon_fp8_gemv_x2")


def test_split_reference_bounds():
    g = torch.Generator().manual_seed(0)
    t, k = 6, 4096
    mags = torch.pow(2.0, torch.randint(-30, 20, (t, k), generator=g).float())
    x = (torch.randn(t, k, generator=g).sign() * mags).bfloat16()
    x[0, :32] = 0  # an all-zero block
    h, lo, sc = gx.split_reference(x)
    assert h.dtype == lo.dtype == torch.float8_e4m3fn and sc.shape == (t, k // 32)
    assert torch.all(h.float().abs() <= 256) and torch.isfinite(lo.float()).all()
    xb = x.float().reshape(t, k // 32, 32)
    back = (h.float() + lo.float()).reshape(t, k // 32, 32) * sc[..., None]
    amax = xb.abs().amax(dim=2, keepdim=True)
    err = (back - xb).abs()
    assert torch.all(err <= amax * 2.0 ** -17)
    big = xb.abs() >= amax * 2.0 ** -10
    assert torch.equal(back[big], xb[big])
    assert torch.all(back[0, 0] == 0)
    assert torch.all((sc.view(torch.int32) & 0x7FFFFF) == 0)  # powers of two


def _sass(consts):
    from triton.experimental.gluon import language as gl

    from deepinfer_nvidia.tests.sass_count import count, missing_tools

    if missing_tools(gx._gemv):
        pytest.skip(missing_tools(gx._gemv))
    lay = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    sig = {"x_ptr": "*bf16", "q_desc": f"tensordesc<fp8e4nv[64,128],{lay!r}>", "s_ptr": "*u8", "y_ptr": "*bf16",
           "part_ptr": "*fp32", "cnt_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32", "stride_x": "i32",
           "s_cols": "i32", "NG": "i32", "k_per_split": "i32"}
    base = {"BN_BLK": 32, "BK_BLK": 32, "SPLIT": 4, "BLOCK_M": 8, "ROWS": 1, "KSUB": 2, "STAGES": 4, "PDL": 0,
            "num_warps": 4}
    return count(gx._fp8x2_gemv_kernel, sig, {**base, **consts}, warps=4,
                 div16=frozenset({"N", "K", "stride_x", "k_per_split"}))


@pytest.mark.parametrize("block_m,rows,ksub", [(8, 1, 2), (8, 8, 1), (16, 16, 2)])
def test_loop_moves_weights_by_tma_only(block_m, rows, ksub):
    from deepinfer_nvidia.tests.sass_count import opcodes

    r = _sass({"BLOCK_M": block_m, "ROWS": rows, "KSUB": ksub})
    ops, loop = r["ops"], r["loop"]
    assert ops.get(f"QGMMA.64x{block_m}x32.F32.E4M3.E4M3", 0) == 8 * ksub, ops
    assert ops.get("UTMALDG.2D", 0) == ksub, ops
    every = opcodes(r["sass"])
    assert not any(o.startswith(("LDGSTS", "HGMMA")) for o in every)  # no cp.async, no bf16 wgmma
    # the weight tile is never read by a thread: shared loads are the 4-byte x scales only
    assert all(o == "LDS.64" or o == "LDS" for o in every if o.startswith("LDS")), [o for o in every if "LDS" in o]
    if rows < block_m or block_m == 8:  # fewer instructions per 8 KB of weights than gluon_fp8_gemv's 283
        assert len(loop) / ksub < 300, len(loop)


def test_pdl_requests_weights_before_the_wait():
    from deepinfer_nvidia.tests.sass_count import opcodes

    ops = opcodes(_sass({"PDL": 1})["sass"])
    plain = opcodes(_sass({"PDL": 0})["sass"])
    assert not {"ACQBULK", "PREEXIT"} & set(plain)
    wait, release = ops.index("ACQBULK"), ops.index("PREEXIT")
    assert ops[:wait].count("UTMALDG.2D") == 4 * 2  # STAGES steps of KSUB boxes
    assert all(i > wait for i, o in enumerate(ops) if o.startswith(("LDG.E.U16", "LDG.E.128", "LDG.E.64")))
    assert all(i > wait for i, o in enumerate(ops) if o.startswith(("STG", "RED", "ATOM")))
    assert release > max(i for i, o in enumerate(ops) if o.startswith("QGMMA"))


def test_split_plan_keeps_steps_inside_a_split(monkeypatch):
    """The host rounds each split to whole steps of KSUB tiles, so a step's second box never reads the next
    split's columns (it may pass K: TMA fills zeros, x and the scales are masked)."""
    seen = {}

    class _Launch:
        def __getitem__(self, grid):
            def run(*a, **kw):
                seen.update(grid=grid, k_per=a[12], kw=kw)
            return run

    monkeypatch.setattr(gx, "_fp8x2_gemv_kernel", _Launch())
    monkeypatch.setattr(gx, "weight_desc", lambda q: None)
    monkeypatch.setattr(gx._gemv, "split_k_tiles", lambda *a: 3)  # 3 tiles a split -> 4 at 2 tiles a step
    x = torch.zeros(1, 1280, dtype=torch.bfloat16)
    q = torch.zeros(128, 1280, dtype=torch.uint8)
    s = torch.zeros(4, 40, dtype=torch.uint8)
    import deepinfer_nvidia.kernels.triton_fp8_gemv as fg
    monkeypatch.setattr(fg, "_counters", lambda dev, n: torch.zeros(n, dtype=torch.int32))
    gx.gemv_fp8x2(x, q, s, 40, 32, 32, 132, ksub=2, pdl=False)
    assert seen["k_per"] == 512 and seen["grid"] == (2, 3)
    assert seen["kw"]["ROWS"] == 1 and seen["kw"]["BLOCK_M"] == 8 and seen["kw"]["KSUB"] == 2
