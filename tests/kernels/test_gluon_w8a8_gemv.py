"""The MXFP8-activation FP8 GEMV (``deepinfer_nvidia.kernels.gluon_w8a8_gemv``, opt-in), checked without a GPU:

- the activation quantisation is core's ``quant_rows_pow2`` at 32 columns (its code formula and round trip are
  tested in ``tests/kernels/test_quant_gemm.py``);
- ``w8a8_reference`` against a direct float64 computation, and its distance from the bf16 reference;
- ``launch_plan``: splits cover K, no program holds more than ``KT_MAX`` tiles of x;
- the machine code (sm_90a, Triton's own ptxas): the K loop is 4 FP8 ``wgmma`` (``QGMMA.64xNx32.F32.E4M3.E4M3``) and
  4 sixteen-byte weight copies a tile, with no weight decode and no spill, under 200 instructions a warp a tile at 8
  rows (the bf16 kernel: ~293); the activations are quantised with saturating round-to-nearest conversions before
  the loop. The outputs themselves are compared on the GPU by ``deepinfer_nvidia/tests/test_conformance_w8a8_gemv.py``.
"""
from __future__ import annotations

import pytest
import torch

gw = pytest.importorskip("deepinfer_nvidia.kernels.gluon_w8a8_gemv")


def test_reference_is_the_dequantised_product():
    from deepinfer_core.kernels.ops.gemm import fp8_block
    from deepinfer_core.kernels.ops.quant import quant_fp8_block

    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 256, generator=g).bfloat16()
    for block in ((32, 32), (128, 128)):
        q, s = quant_fp8_block(torch.randn(192, 256, generator=g) / 16, block, "ue8m0")
        xq, code = gw.mxfp8_quant_reference(x)
        xd = xq.double() * torch.exp2(code.double() - 127).repeat_interleave(32, 1)
        wd = q.double() * torch.exp2(s.view(torch.uint8).double() - 127).repeat_interleave(block[0], 0)[:192] \
            .repeat_interleave(block[1], 1)[:, :256]
        ref = gw.w8a8_reference(x, q, s, *block)
        torch.testing.assert_close(ref, (xd @ wd.t()).float(), rtol=1e-6, atol=1e-6)
        # what MXFP8 activations cost against the bf16 reference: a few percent of the output's scale
        bf = fp8_block(x, q, s, block).float()
        rel = ((ref - bf).pow(2).mean().sqrt() / bf.pow(2).mean().sqrt()).item()
        assert 1e-3 < rel < 5e-2, rel


@pytest.mark.parametrize("m,n,k", [(1, 1792, 5120), (1, 36864, 1280), (8, 8192, 512), (16, 5120, 8192),
                                   (1, 4608, 5120), (2, 5120, 2304), (1, 64, 128), (1, 25600, 6144)])
def test_launch_plan(m, n, k):
    tiles, block_m, k_per, split = gw.launch_plan(m, n, k, 132)
    assert tiles * 64 >= n and block_m in (8, 16) and block_m >= m
    assert k_per % 128 == 0 and k_per // 128 <= gw.KT_MAX and split * k_per >= k > (split - 1) * k_per


triton = pytest.importorskip("triton")
from deepinfer_nvidia.tests.sass_count import count, missing_tools, opcodes  # noqa: E402

SIG = {"x_ptr": "*bf16", "q_ptr": "*fp8e4nv", "s_ptr": "*u8", "y_ptr": "*bf16", "part_ptr": "*fp32",
       "cnt_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32", "stride_x": "i32", "s_cols": "i32", "NG": "i32",
       "k_per_split": "i32"}


@pytest.mark.parametrize("block_m,blk,split,kt,pdl", [(8, 32, 2, 3, 1), (16, 128, 1, 10, 0)])
def test_loop_is_four_fp8_wgmma_and_no_decode(block_m, blk, split, kt, pdl):
    if missing_tools(gw):
        pytest.skip(missing_tools(gw))
    consts = {"BN_BLK": blk, "BK_BLK": blk, "SPLIT": split, "BLOCK_M": block_m, "STAGES": gw.STAGES, "KT": kt,
              "PDL": pdl, "num_warps": 4}
    r = count(gw._w8a8_gemv_kernel, SIG, consts, warps=4,
              div16=frozenset({"N", "K", "stride_x", "k_per_split", "NG"}))
    ops = r["ops"]

    def has(prefix):
        return sum(v for o, v in ops.items() if o.startswith(prefix))

    assert has(f"QGMMA.64x{block_m}x32.F32.E4M3.E4M3") == 4, ops
    assert has("HGMMA") == 0 and has("HMUL2") == 0, ("a decoded bf16 tile", ops)
    assert ops.get("LDGSTS.E.BYPASS.128", 0) == 4, ops
    assert has("F2FP") == 0, ("activations quantised inside the loop", ops)
    every = opcodes(r["sass"])
    assert not any(o.startswith(("STL", "LDL")) for o in every), "a spill"
    assert any(o.startswith("F2FP.SATFINITE.E4M3") for o in every), "no saturating e4m3 conversion"
    if block_m == 8:
        assert len(r["loop"]) < 200, len(r["loop"])


def test_programmatic_dependent_launch_orders_the_prologue():
    """With PDL the kernel requests its first weight tiles (16-byte copies) and their scales (never written by a
    kernel) before ``griddepcontrol.wait`` (ACQBULK), and loads x (the 16-byte LDG) and stores only after it; it lets
    the next kernel launch (PREEXIT) after its K loop. Without PDL neither instruction is emitted."""
    if missing_tools(gw):
        pytest.skip(missing_tools(gw))
    consts = {"BN_BLK": 32, "BK_BLK": 32, "SPLIT": 4, "BLOCK_M": 8, "STAGES": gw.STAGES, "KT": 5, "num_warps": 4}
    div16 = frozenset({"N", "K", "stride_x", "k_per_split", "NG"})
    every = opcodes(count(gw._w8a8_gemv_kernel, SIG, {**consts, "PDL": 1}, warps=4, div16=div16)["sass"])
    wait = every.index("ACQBULK")
    assert any(o.startswith("LDGSTS") for o in every[:wait]), "no weight copy before the wait"
    assert not any(o.startswith(("LDG.E.128", "STG", "RED", "ATOM")) for o in every[:wait]), every[:wait]
    assert any(o.startswith("LDG.E.128") for o in every[wait:]), "x not loaded after the wait"
    assert "PREEXIT" in every[wait:]
    plain = opcodes(count(gw._w8a8_gemv_kernel, SIG, {**consts, "PDL": 0}, warps=4, div16=div16)["sass"])
    assert "ACQBULK" not in plain and "PREEXIT" not in plain
