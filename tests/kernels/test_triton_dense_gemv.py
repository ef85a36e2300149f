"""``gemm.dense``'s Triton provider (``deepinfer_nvidia/kernels/triton_dense_gemv.py``): the split-K GEMV against
the reference in Triton's CPU interpreter (fp32 / bf16 / fp16 x, fp32 / bf16 / fp16 weights, 1-4 rows, ragged N and K,
strided operands, one split and many; ``gemm.dense_wide``'s launch widening bf16 / fp16 x to fp32 weights), which operands it takes and which go to cuBLAS, its registration, and
its sm_90a compile (PDL wait first, 16-byte weight loads)."""
from __future__ import annotations

import pytest

_INTERPRETED = r"""
import torch
from deepinfer_nvidia.kernels import triton_dense_gemv as dg

g = torch.Generator().manual_seed(0)
n_cases = n_wide = 0
dg.ONE_PASS = False  # the split over K first (on by default; the one-pass launch has its own cases below)
for xd, wd in [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32),
               (torch.float16, torch.float16)]:
    for m, n, k, sms in [(1, 384, 1024, 132), (2, 37, 300, 132), (3, 16, 4, 132), (4, 50, 2052, 132),
                         (1, 20, 1536, 1), (1, 5, 8192, 132)]:
        x = torch.randn(m, k, generator=g).to(xd)
        w = (torch.randn(n, k, generator=g) / k ** 0.5).to(wd)
        bm, bk, split = dg.plan(m, n, k, sms)
        got = dg.gemv(x, w, sms)
        # the interpreter rounds float -> bf16 toward zero (the GPU to nearest): the weight cast emulated here,
        # the output's rounding allowed one unit below
        w_eff = (w.float().view(torch.int32) & -65536).view(torch.float32) if (xd, wd) == (torch.bfloat16,
                                                                                    torch.float32) else w.to(xd)
        exact = x.double() @ w_eff.double().t()
        assert got.dtype == xd and got.shape == (m, n)
        err = (got.double() - exact).abs()
        fp32_sums = 1e-5 * max(1.0, exact.abs().max().item())
        if xd == torch.float32:
            assert err.max() <= fp32_sums, (m, n, k, err.max().item())
        else:
            bits = 7 if xd == torch.bfloat16 else 10
            unit = torch.exp2(torch.floor(torch.log2(exact.abs().clamp_min(1e-30))) - bits)
            assert (err <= unit + fp32_sums).all(), (xd, wd, m, n, k, (err - unit).max().item())
        n_cases += 1
        if split > 1:
            n_cases += 100  # counted apart: the split path ran
# strided operands: x a column slice, w a column slice of a wider matrix (row stride > K)
big_x = torch.randn(2, 700, generator=g)
big_w = torch.randn(40, 700, generator=g)
x, w = big_x[:, 100:612], big_w[:, 100:612]
assert torch.allclose(dg.gemv(x, w, 132), x @ w.t(), rtol=1e-5, atol=1e-5)
# the counters are reset: a second split launch on the same row tiles gives the same bits
a = dg.gemv(x, w, 132)
assert torch.equal(a, dg.gemv(x, w, 132))
# gemm.dense_wide: bf16 / fp16 x widened to fp32 weights in the kernel (no cast launch): fp32 out, fp32 sums of
# the exact products of the unrounded weights
for xd in (torch.bfloat16, torch.float16):
    for m, n, k, sms in [(1, 384, 5120, 132), (4, 50, 2052, 132), (1, 20, 1536, 1)]:
        x = torch.randn(m, k, generator=g).to(xd)
        w = torch.randn(n, k, generator=g) / k ** 0.5
        got = dg.gemv(x, w, sms, widen=True)
        exact = x.double() @ w.double().t()
        assert got.dtype == torch.float32 and got.shape == (m, n)
        assert (got.double() - exact).abs().max() <= 1e-5 * max(1.0, exact.abs().max().item()), (xd, m, n, k)
        n_wide += 1
# the one-pass launch (DEEPINFER_NV_DENSE_ONE_PASS): one row over the whole K, a few weight rows a program; dense and
# dense_wide numerics as above
dg.ONE_PASS = True
n_one = 0
for xd, wd, widen in [(torch.float32, torch.float32, False), (torch.bfloat16, torch.bfloat16, False),
                      (torch.bfloat16, torch.float32, True), (torch.bfloat16, torch.bfloat16, True)]:
    for n, k in [(384, 5120), (37, 1000), (5, 8192)]:
        assert dg.one_pass_plan(1, k) is not None and dg.plan(1, n, k, 132)[2] > 1
        x = torch.randn(1, k, generator=g).to(xd)
        w = (torch.randn(n, k, generator=g) / k ** 0.5).to(wd)
        got = dg.gemv(x, w, 132, widen=widen, out_dtype=torch.float32 if widen else None)
        exact = x.double() @ w.double().t()
        if widen or xd == torch.float32:
            assert (got.double() - exact).abs().max() <= 1e-5 * max(1.0, exact.abs().max().item()), (xd, n, k)
        else:
            unit = torch.exp2(torch.floor(torch.log2(exact.abs().clamp_min(1e-30))) - 7)
            assert ((got.double() - exact).abs() <= unit + 1e-5).all(), (xd, wd, n, k)
        n_one += 1
print("INTERPRETED", n_cases, "WIDE", n_wide, "ONE", n_one)
"""


def test_gemv_in_the_interpreter(run_interpreted):
    proc = run_interpreted(_INTERPRETED, "INTERPRETED")
    n = int(proc.stdout.split("INTERPRETED")[-1].split()[0])
    assert n % 100 == 24 and n // 100 >= 8  # all 24 cases ran, at least 8 of them split over K
    assert int(proc.stdout.split("WIDE")[-1].split()[0]) == 6
    assert int(proc.stdout.split("ONE")[-1].split()[0]) == 12


def test_plan_shapes(monkeypatch):
    dg = pytest.importorskip("deepinfer_nvidia.kernels.triton_dense_gemv")
    # V4.1's router [384, 5120] and a compressor's wkv [512, 5120] at one row: 512-column tiles, 10 splits
    assert dg.plan(1, 384, 5120, 132) == (1, 512, 10)
    assert dg.plan(1, 512, 5120, 132) == (1, 512, 10)
    assert dg.plan(2, 512, 5120, 132) == (2, 256, 10)
    assert dg.plan(4, 1024, 5120, 132) == (4, 128, 8)
    # DEEPINFER_NV_DENSE_ONE_PASS: the router's row in one 8192-wide tile, one weight row a program
    assert dg.one_pass_plan(1, 5120) == (1, 8192) and dg.one_pass_plan(1, 1536) == (4, 2048)
    assert dg.one_pass_plan(2, 5120) is None and dg.one_pass_plan(1, 9000) is None
    # what gemv launches: the one pass where the split would apply (knob on), else plan()'s tiling
    monkeypatch.setattr(dg, "ONE_PASS", True)
    assert dg.launch_plan(1, 384, 5120, 132) == (1, 1, 8192, 1)
    assert dg.launch_plan(2, 512, 5120, 132) == (2, dg.BLOCK_N, 256, 10)
    assert dg.launch_plan(1, 384, 9000, 132)[3] > 1
    monkeypatch.setattr(dg, "ONE_PASS", False)
    assert dg.launch_plan(1, 384, 5120, 132) == (1, dg.BLOCK_N, 512, 10)
    for m in range(1, 5):
        for n in (1, 16, 100, 5000):
            for k in (4, 100, 512, 5120, 20000):
                bm, bk, split = dg.plan(m, n, k, 132)
                tiles = -(-k // bk)
                per = -(-tiles // split)
                assert bm >= m and bm * dg.BLOCK_N * bk <= dg.TILE_ELEMS or bk == 16
                assert 1 <= split <= dg.MAX_SPLIT and (split - 1) * per < tiles <= split * per


def test_operands_it_takes():
    import torch

    dg = pytest.importorskip("deepinfer_nvidia.kernels.triton_dense_gemv")
    x, w = torch.zeros(4, 512), torch.zeros(384, 512)
    assert dg.takes(x, w)
    assert not dg.takes(torch.zeros(5, 512), w)  # rows: cuBLAS
    assert not dg.takes(torch.zeros(1, 510), torch.zeros(384, 510))  # K not a multiple of 4
    assert not dg.takes(x, w.t().contiguous().t())  # column-strided weight
    assert not dg.takes(torch.zeros(1, 4096), torch.zeros(20000, 4096))  # 82 M elements: the vocabulary head
    assert not dg.takes(torch.zeros(1, 512, dtype=torch.int32), w)
    # CPU operands: the reference, whatever the shape
    from deepinfer_core.kernels.ops.gemm import dense

    xs, ws = torch.randn(2, 64), torch.randn(8, 64)
    assert torch.equal(dg.gemm_dense(xs, ws), dense(xs, ws))
    with pytest.raises(ValueError, match="gemm.dense"):
        dg.gemm_dense(xs, torch.randn(8, 63))


def test_registered_before_cublas():
    from deepinfer_nvidia.kernels import IMPLS

    rows = [r for r in IMPLS if r[0] == "gemm.dense"]
    providers = [r[1] for r in rows]
    assert "triton" in providers and "aten" in providers
    row = rows[providers.index("triton")]
    assert row[2].endswith("triton_dense_gemv:gemm_dense") and not (len(row) > 4 and row[4])
    from deepinfer_nvidia.platform import NvidiaPlatform

    order = list(NvidiaPlatform.default_providers)
    assert order.index("triton") < order.index("aten")


@pytest.mark.parametrize("widen", [0, 1])
def test_compiles_for_sm90_with_the_wait_first(widen):
    """fp32 x (``gemm.dense``), and bf16 x widened to fp32 weights (``gemm.dense_wide``, WIDEN=1)."""
    pytest.importorskip("triton")
    dg = pytest.importorskip("deepinfer_nvidia.kernels.triton_dense_gemv")
    from deepinfer_nvidia.tests.sass_count import count, missing_tools, opcodes

    if missing_tools(dg):
        pytest.skip(missing_tools(dg))
    sig = {"x_ptr": "*bf16" if widen else "*fp32", "w_ptr": "*fp32", "y_ptr": "*fp32", "part_ptr": "*fp32",
           "cnt_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32", "stride_x": "i32", "stride_w": "i32",
           "k_per_split": "i32"}
    res = count(dg._dense_gemv_kernel, sig, {"SPLIT": 10, "BLOCK_M": 1, "BLOCK_N": 16, "BLOCK_K": 512, "PDL": 1,
                                             "WIDEN": widen},
                warps=4, div16=frozenset({"K", "stride_x", "stride_w", "k_per_split"}))
    ops = opcodes(res["sass"])
    first_load = min(i for i, o in enumerate(ops) if o.startswith("LDG"))
    assert ops.index("ACQBULK") < ops.index("PREEXIT") < first_load
    assert any(o.startswith("LDG.E.128") for o in ops)  # the weight rows move 16 bytes a load
    assert not any(o.startswith(("STL", "LDL")) for o in ops)  # no spills


def test_what_it_does_not_take_goes_to_cublas(monkeypatch):
    """On a CUDA-looking operand pair outside ``takes`` (5 rows), the launch is ``aten_ops.gemm_dense``'s."""
    import torch

    dg = pytest.importorskip("deepinfer_nvidia.kernels.triton_dense_gemv")
    from deepinfer_nvidia.kernels import aten_ops

    assert dg.cublas_dense is aten_ops.gemm_dense and dg.supports_dense is aten_ops.supports_dense
    calls = []
    monkeypatch.setattr(dg, "supports_dense", lambda x, w: True)
    monkeypatch.setattr(dg, "cublas_dense", lambda x, w: calls.append(x.shape) or x @ w.t())
    monkeypatch.setattr(dg, "gemv", lambda x, w, sms: calls.append(("gemv", x.shape)) or x @ w.t())
    x, w = torch.randn(5, 64), torch.randn(8, 64)
    assert torch.allclose(dg.gemm_dense(x, w), x @ w.t())
    assert calls == [(5, 64)]
    monkeypatch.setattr("deepinfer_nvidia.kernels.triton_gemm._sm_count", lambda device: 132)
    dg.gemm_dense(x[:2], w)
    assert calls[-1] == ("gemv", (2, 64))


@pytest.mark.parametrize("wd", ["*bf16", "*fp32"])
def test_one_pass_compiles_for_sm90_without_spills(wd):
    """``DEEPINFER_NV_DENSE_ONE_PASS``'s launch of the router (one bf16 row of 5120 widened, one weight row a program,
    an 8192-wide tile): the wait first, 16-byte weight loads, no spills."""
    pytest.importorskip("triton")
    dg = pytest.importorskip("deepinfer_nvidia.kernels.triton_dense_gemv")
    from deepinfer_nvidia.tests.sass_count import count, missing_tools, opcodes

    if missing_tools(dg):
        pytest.skip(missing_tools(dg))
    bn, bk = dg.one_pass_plan(1, 5120)
    sig = {"x_ptr": "*bf16", "w_ptr": wd, "y_ptr": "*fp32", "part_ptr": "*fp32", "cnt_ptr": "*i32", "M": "i32",
           "N": "i32", "K": "i32", "stride_x": "i32", "stride_w": "i32", "k_per_split": "i32"}
    res = count(dg._dense_gemv_kernel, sig, {"SPLIT": 1, "BLOCK_M": 1, "BLOCK_N": bn, "BLOCK_K": bk, "PDL": 1,
                                             "WIDEN": 1, "EARLY": 1},
                warps=4, div16=frozenset({"K", "stride_x", "stride_w", "k_per_split"}))
    ops = opcodes(res["sass"])
    first_load = min(i for i, o in enumerate(ops) if o.startswith("LDG"))
    assert ops.index("ACQBULK") < ops.index("PREEXIT") < first_load
    assert any(o.startswith("LDG.E.128") for o in ops)
    assert not any(o.startswith(("STL", "LDL")) for o in ops)
