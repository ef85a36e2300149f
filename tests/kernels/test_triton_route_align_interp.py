"""``triton_route_align`` (``moe.topk_experts_mxfp4``'s launch at one token) under Triton's CPU interpreter: the
weights and ids equal ``route_topk``'s bit for bit and the layout equals ``triton_moe.align``'s torch form and
``align_small``'s launch (with x in the swap kernels' K order), at V4.1's 384 experts and width (nine routings),
256 experts, one expert a token, tied logits and a NaN logit; and the op on CPU operands hands off to the parts,
equal to the reference. Its sm_90a PDL order (the wait first): ``test_pdl_sass.py``'s cases."""
from __future__ import annotations

import pytest

CODE = r'''
import torch
from deepinfer_nvidia.kernels import triton_align as ta
from deepinfer_nvidia.kernels import triton_moe as tm
from deepinfer_nvidia.kernels import triton_route as tr
from deepinfer_nvidia.kernels import triton_route_align as tra

g = torch.Generator().manual_seed(0)
cases = 0
shapes = [(384, 6, 5120, 8, 2, "rand"), (256, 6, 4096, 16, 1, "rand"), (8, 1, 256, 8, 2, "rand"),
          (64, 8, 1152, 16, 1, "tie"), (100, 4, 256, 8, 2, "nan"), (384, 6, 5120, 8, 2, "tie")]
shapes += [(384, 6, 256, 8, 2, "rand")] * 8  # more routings at V4.1's expert count (narrow x: the layout counts)
for e, k, d, bm, perm, kind in shapes:
    logits = torch.randn(1, e, generator=g)
    bias = torch.randn(e, generator=g) * 0.1
    if kind == "tie":
        logits[:] = 0.5
        bias[:] = 0.0
    if kind == "nan":
        logits[0, 7] = float("nan")
    x = torch.randn(1, d, generator=g).to(torch.bfloat16)
    w_ref, ids_ref = tr.route_topk(logits, bias, k, 2.5, force_kernel=True)
    nb = tm.num_blocks(k, e, bm)
    pair_ref, bexp_ref, xp_ref = ta.align_small(ids_ref, e, bm, nb, x, perm)
    torch_form = tm.align(ids_ref, e, bm)
    w = torch.full((1, k), -1.0)
    ids = torch.full((1, k), -1, dtype=torch.long)
    pair, bexp, xp = tra.launch_route_align(logits, bias, k, 2.5, x, bm, nb, perm, w, ids)
    assert torch.equal(ids, ids_ref), (kind, ids, ids_ref)
    assert torch.equal(w.view(torch.int32), w_ref.view(torch.int32)), (kind, w, w_ref)
    assert torch.equal(pair, pair_ref) and torch.equal(pair, torch_form[0]), (kind, pair, pair_ref)
    assert torch.equal(bexp, bexp_ref) and torch.equal(bexp, torch_form[1]), (kind, bexp, bexp_ref)
    assert torch.equal(xp, xp_ref), kind
    cases += 1
try:
    tra.launch_route_align(logits, bias, 4, 2.5, x[:, :100], 8, nb, 2, w, ids)
except ValueError as exc:
    assert "multiple of 128" in str(exc), exc
    cases += 1
print("ROUTE_ALIGN_OK", cases)
'''


def test_route_align_equals_route_then_align(run_interpreted):
    run_interpreted(CODE, "ROUTE_ALIGN_OK 15")


def test_the_op_on_cpu_operands_runs_the_parts_references():
    """Off the GPU every part hands off to its reference: the op equals core's composed reference on its cases."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    from deepinfer_core.kernels.ops.moe import OPS
    from deepinfer_nvidia.kernels.triton_route_align import topk_experts_mxfp4

    spec = next(s for s in OPS if s.name == "moe.topk_experts_mxfp4")
    n = 0
    for args, kwargs in spec.input_gen(torch.bfloat16, "cpu", 1):
        assert torch.equal(topk_experts_mxfp4(*args, **kwargs), spec.reference(*args, **kwargs))
        n += 1
    assert n == 5
