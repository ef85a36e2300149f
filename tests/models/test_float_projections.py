"""The fp32 projections as the checkpoint stores them (``DEEPINFER_NATIVE_FLOAT_PROJECTIONS``, on by default): the
routers and the compressors' wkv / wgate keep the checkpoint's bf16, and ``gemm.dense_wide`` / ``moe.router_topk``
widen them exactly, so the logits equal those of the fp32 copies made at load with the knob off."""
from __future__ import annotations

import torch

from deepinfer_models.deepseek_v41.loading import load_deepseek_v41
from deepinfer_models.layers import linear as linear_mod
from tests.models.test_entry_slot_share import _run
from tests.models.v41_helpers import prompt, tiny_ckpt

_REQUESTS = [prompt(26, seed=31), prompt(20, seed=32)]  # the schedule feeds every token
_SCHEDULE = [[(0, 15), (1, 9)], [(0, 8), (1, 8)]] + [[(0, 1), (1, 1)]] * 3


def test_float_projections_as_stored_are_bit_equal(monkeypatch):
    ckpt = tiny_ckpt("flash", "fp4")
    monkeypatch.setattr(linear_mod, "NATIVE_FLOAT_PROJECTIONS", False)
    widened = load_deepseek_v41(ckpt, dtype=torch.bfloat16)
    assert all(layer["ffn"].gate_w.dtype == torch.float32 for layer in widened.layers)
    want = _run(widened, _REQUESTS, _SCHEDULE)
    monkeypatch.setattr(linear_mod, "NATIVE_FLOAT_PROJECTIONS", True)
    native = load_deepseek_v41(ckpt, dtype=torch.bfloat16)
    assert all(layer["ffn"].gate_w.dtype == torch.bfloat16 for layer in native.layers)
    compressors = [layer["attn"].compressor for layer in native.layers if layer["attn"].compressor is not None]
    assert compressors and all(c.wkv.dtype == torch.bfloat16 for c in compressors)
    assert any(c.wgate is not None for c in compressors)
    assert torch.equal(_run(native, _REQUESTS, _SCHEDULE), want)
