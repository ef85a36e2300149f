"""``triton_align.align_small`` (one-launch routing layout of the MoE kernels) under Triton's CPU interpreter:
identical to the torch form of ``triton_moe.align`` (rows, sentinels, block owners) for random, skewed
(every pair on one expert, runs longer than a block) and single-pair routings, block sizes 16 and 128, and
batch 256's 1536 pairs; and the same launch's copy of the activations into the swap kernels' K order."""
from __future__ import annotations

CODE = r'''
import torch
from deepinfer_nvidia.kernels import triton_align as ta
from deepinfer_nvidia.kernels import triton_moe as tm

g = torch.Generator().manual_seed(0)
cases = 0
for t, k, e in ((1, 6, 384), (1, 1, 8), (5, 6, 16), (64, 6, 384), (40, 3, 3), (170, 6, 256), (256, 6, 384)):
    if t == 256:  # batch 256: the largest sort (2048 keys), one routing and one block size
        ids = torch.rand(t, e, generator=g).topk(k, dim=1).indices
        nb = tm.num_blocks(t * k, e, 16)
        assert all(torch.equal(a, b) for a, b in zip(ta.align_small(ids, e, 16, nb), tm.align(ids, e, 16)))
        cases += 1
        continue
    for route in ("rand", "one"):
        if route == "rand":
            ids = torch.rand(t, e, generator=g).topk(k, dim=1).indices
        else:
            ids = torch.full((t, k), e - 1, dtype=torch.long)
        for bm in (16, 128):
            nb = tm.num_blocks(t * k, e, bm)
            ref = tm.align(ids, e, bm)  # CPU tensors: the torch form
            out = ta.align_small(ids, e, bm, nb)
            assert torch.equal(out[0], ref[0]), (t, k, e, route, bm, out[0], ref[0])
            assert torch.equal(out[1], ref[1]), (t, k, e, route, bm, out[1], ref[1])
            cases += 1
print("ALIGN_OK", cases)
'''

PERMUTE = r'''
import torch
from deepinfer_nvidia.kernels import triton_align as ta
from deepinfer_nvidia.kernels import triton_moe as tm
from deepinfer_nvidia.kernels.gluon_moe_swap import permute_k

g = torch.Generator().manual_seed(1)
cases = 0
for t, k, e, d in ((1, 6, 384, 5120), (3, 6, 16, 256), (7, 2, 8, 1152)):
    ids = torch.rand(t, e, generator=g).topk(k, dim=1).indices
    x = torch.randn(t, d, generator=g).to(torch.bfloat16)
    nb = tm.num_blocks(t * k, e, 16)
    ref = tm.align(ids, e, 16)
    for perm in (1, 2):
        pair, bexp, xp = ta.align_small(ids, e, 16, nb, x, perm)
        assert torch.equal(pair, ref[0]) and torch.equal(bexp, ref[1])
        assert torch.equal(xp, permute_k(x, perm == 2)), (t, d, perm)
        cases += 1
try:
    ta.align_small(ids, e, 16, nb, x[:, :100], 2)
except ValueError as exc:
    assert "contiguous" in str(exc)
    cases += 1
print("PERMUTE_OK", cases)
'''


def test_align_small_equals_torch_form(run_interpreted):
    run_interpreted(CODE, "ALIGN_OK 25")


def test_the_same_launch_puts_the_activations_in_k_order(run_interpreted):
    """Programs 1.. of the launch copy x into the swap kernels' K order: equal to ``permute_k`` (the bit reversal
    of 3 bits, and the 128-column fragment order) at 1-7 tokens, the layout unchanged; a strided x is refused."""
    run_interpreted(PERMUTE, "PERMUTE_OK 7")


def test_align_with_permute_compiles_for_sm90():
    """The launch with the permuting programs compiles for sm_90a, the PDL wait before any global access."""
    import pytest

    pytest.importorskip("triton")
    ta = pytest.importorskip("deepinfer_nvidia.kernels.triton_align")
    from deepinfer_nvidia.tests.sass_count import count, missing_tools, opcodes

    if missing_tools(ta):
        pytest.skip(missing_tools(ta))
    sig = {"ids_ptr": "*i64", "scratch_ptr": "*i32", "pair_ptr": "*i32", "bexp_ptr": "*i32", "x_ptr": "*bf16",
           "xp_ptr": "*bf16", "P": "i32", "E": "i32", "NROWS": "i32", "NB": "i32", "XN": "i32", "K": "i32"}
    for perm in (1, 2):
        sass = count(ta._align_sort_kernel, sig, {"BLOCK_M": 16, "PB": 16, "EB": 512, "PERM": perm, "XB": ta.XB,
                                                   "PDL": 1}, warps=4)["sass"]
        ops = opcodes(sass)
        first = min(i for i, o in enumerate(ops) if o.startswith(("LDG", "STG")))
        assert ops.index("ACQBULK") < ops.index("PREEXIT") < first
