"""The routed experts' output as slots (``DEEPINFER_MOE_SLOTS_IN_EXPAND``): ``MoEV4.parts`` hands ``mhc.expand`` the
routed output as [T, S, D] slots (``moe.experts*_slots``) and the expand adds them with the shared output.

- Where the platform has no slot kernel (the reference platform here) the slots op is the summed op as one slot, so
  the logits are bit-equal to the default, and the slots op is what runs.
- With a slot kernel (here a pure-torch one that returns each (token, slot) pair's weighted expert output in fp32,
  as the GPU kernels do) the logits match the default within fp32 rounding of the different summation order.
"""
from __future__ import annotations

import pytest
import torch

from deepinfer_core.kernels.ops.linalg import linear_rows
from deepinfer_core.kernels.ops.moe import SLOT_OPS, clamped_swiglu, sum_slots
from deepinfer_core.kernels.ops.quant import dequant_fp8_block, dequant_mxfp4
from deepinfer_core.kernels.spec import acc
from deepinfer_models.deepseek_v4 import moe as moe_mod
from deepinfer_models.layers import linear as linear_mod
from deepinfer_models.deepseek_v41.loading import load_deepseek_v41
from tests.models.test_entry_slot_share import _run
from tests.models.v41_helpers import prompt, tiny_ckpt


def _slot_rows(x, weights, ids, get, limit) -> torch.Tensor:
    """[T, k, D] fp32: slot j of token t is ``weights[t, j] * expert_{ids[t, j]}(x_t)`` (the GPU slot kernels' rows)."""
    t, k = ids.shape
    out = torch.empty(t, k, x.shape[1], dtype=torch.float32)
    for i in range(t):
        for j in range(k):
            w1, w3, w2 = get(int(ids[i, j]))
            xe = x[i:i + 1]
            h = clamped_swiglu(linear_rows(xe, w1), linear_rows(xe, w3), limit)
            out[i, j] = (acc(linear_rows(h, w2)) * acc(weights[i, j]))[0]
    return out


def _fp8_slot_kernel(x, weights, ids, w1, s1, w3, s3, w2, s2, block, limit):
    return _slot_rows(x, weights, ids, lambda e: (dequant_fp8_block(w1[e], s1[e], block),
                                                 dequant_fp8_block(w3[e], s3[e], block),
                                                 dequant_fp8_block(w2[e], s2[e], block)), limit)


def _mxfp4_slot_kernel(x, weights, ids, w1, s1, w3, s3, w2, s2, limit):
    return _slot_rows(x, weights, ids, lambda e: (dequant_mxfp4(w1[e], s1[e]), dequant_mxfp4(w3[e], s3[e]),
                                                 dequant_mxfp4(w2[e], s2[e])), limit)


_REQUESTS = [prompt(26, seed=31), prompt(20, seed=32)]  # the schedule feeds every token
_SCHEDULE = [[(0, 15), (1, 9)], [(0, 8), (1, 8)]] + [[(0, 1), (1, 1)]] * 3


@pytest.mark.parametrize("quant,op", [("fp8", "moe.experts_fp8"), ("fp4", "moe.experts_mxfp4")])
def test_slots_in_expand(quant, op, monkeypatch):
    model = load_deepseek_v41(tiny_ckpt("flash", quant), dtype=torch.float32)
    slot_op = SLOT_OPS[op]
    assert slot_op in model.k
    default = _run(model, _REQUESTS, _SCHEDULE)

    monkeypatch.setattr(moe_mod, "SLOTS_IN_EXPAND", True)
    shapes = []

    def recording(fn):
        def run(*args):
            out = fn(*args)
            shapes.append(tuple(out.shape))
            return out
        return run

    model.k[slot_op] = recording(model.k[slot_op])
    assert torch.equal(_run(model, _REQUESTS, _SCHEDULE), default)  # one slot in x.dtype: the default's bits
    assert shapes and all(len(s) == 3 and s[1] == 1 for s in shapes)

    shapes.clear()
    model.k[slot_op] = recording(_fp8_slot_kernel if quant == "fp8" else _mxfp4_slot_kernel)
    slotted = _run(model, _REQUESTS, _SCHEDULE)
    k = model.cfg.num_experts_per_tok
    assert shapes and all(s[1] == k for s in shapes)
    torch.testing.assert_close(slotted, default, atol=2e-4, rtol=2e-4)


def test_sum_slots_is_in_slot_order():
    # 1 + 1e8 - 1e8 in fp32 is 0 in this order (the 1 is absorbed), 1 in the reverse
    slots = torch.tensor([[[1.0], [1e8], [-1e8]]])
    assert sum_slots(slots).item() == 0.0
    assert sum_slots(slots.flip(1)).item() == 1.0


def test_composed_slots_are_one_slot():
    from deepinfer_core.kernels.ops.moe import _gen_experts, experts_dense
    from deepinfer_core.kernels.registry import get_registry

    slots = get_registry().op("moe.experts_slots").reference
    for args, _ in _gen_experts(torch.bfloat16, "cpu", 0):
        out = slots(*args)
        assert out.shape == (args[0].shape[0], 1, args[0].shape[1]) and out.dtype == torch.bfloat16
        assert torch.equal(out[:, 0], experts_dense(*args))


def test_slot_compare_rejects_a_summed_output():
    from deepinfer_core.kernels.registry import get_registry

    spec = get_registry().op("moe.experts_mxfp4_slots")
    ref = torch.randn(3, 1, 8)
    spec.compare(torch.stack([ref[:, 0] * 0.25, ref[:, 0] * 0.75], 1), ref, torch.float32)  # slots summing to it
    with pytest.raises(AssertionError, match="slots must be"):
        spec.compare(ref[:, 0], ref, torch.float32)
    with pytest.raises(AssertionError):
        spec.compare(torch.stack([ref[:, 0], ref[:, 0]], 1), ref, torch.float32)  # sums to twice the output


def test_nvidia_slot_providers_hand_cpu_operands_to_the_summed_reference():
    """Off a GPU the Triton slot providers run the summed reference as one slot; every registered target loads."""
    pytest.importorskip("triton")
    from deepinfer_core.kernels.ops.moe import _gen_experts_fp8, _gen_experts_mxfp4, experts_fp8, experts_mxfp4
    from deepinfer_core.kernels.spec import _load_target
    from deepinfer_nvidia.kernels import IMPLS

    targets = {(op, prov): target for op, prov, target, *_ in IMPLS if op in SLOT_OPS.values()}
    assert set(targets) == {("moe.experts_fp8_slots", "triton"), ("moe.experts_mxfp4_slots", "triton"),
                            ("moe.experts_mxfp4_slots", "deepgemm")}
    fns = {key: _load_target(target) for key, target in targets.items()}
    for key, gen, summed in ((("moe.experts_fp8_slots", "triton"), _gen_experts_fp8, experts_fp8),
                             (("moe.experts_mxfp4_slots", "triton"), _gen_experts_mxfp4, experts_mxfp4),
                             (("moe.experts_mxfp4_slots", "deepgemm"), _gen_experts_mxfp4, experts_mxfp4)):
        for args, _ in gen(torch.float32, "cpu", 1):
            out = fns[key](*args)
            assert out.shape == (args[0].shape[0], 1, args[0].shape[1]), key
            assert torch.equal(out[:, 0], summed(*args)), key


def test_float_projections_as_stored_are_bit_equal(monkeypatch):
    """``DEEPINFER_NATIVE_FLOAT_PROJECTIONS``: the routers and the compressors' wkv / wgate keep the checkpoint's
    bf16 and ``gemm.dense_wide`` / ``moe.router_topk`` widen them (exactly): the same logits as the fp32 copies."""
    ckpt = tiny_ckpt("flash", "fp4")
    default = load_deepseek_v41(ckpt, dtype=torch.bfloat16)
    want = _run(default, _REQUESTS, _SCHEDULE)
    monkeypatch.setattr(linear_mod, "NATIVE_FLOAT_PROJECTIONS", True)
    native = load_deepseek_v41(ckpt, dtype=torch.bfloat16)
    assert all(layer["ffn"].gate_w.dtype == torch.bfloat16 for layer in native.layers)
    compressors = [layer["attn"].compressor for layer in native.layers if layer["attn"].compressor is not None]
    assert compressors and all(c.wkv.dtype == torch.bfloat16 for c in compressors)
    assert any(c.wgate is not None for c in compressors)
    assert torch.equal(_run(native, _REQUESTS, _SCHEDULE), want)
