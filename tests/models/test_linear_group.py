"""``LinearGroup`` (deepinfer_models/layers/linear.py): linears that read one input, run as one product over their
stacked weights. The merged product must give each member's output (the reference kernels here), its members must
read the same bytes (no second copy), and members whose layouts cannot stack must run one after another."""
from __future__ import annotations

import pytest
import torch

from deepinfer_core.kernels.ops import gemm
from deepinfer_core.kernels.ops.quant import quant_fp8_block, quant_mxfp4
from deepinfer_models.layers.linear import Linear, LinearGroup

KERNELS = {"gemm.dense": gemm.dense, "gemm.fp8_block": gemm.fp8_block, "gemm.mxfp4": gemm.mxfp4}


def members(fmt: str, outs: list[int], k: int, block=(32, 32), seed: int = 0) -> list[Linear]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, n in enumerate(outs):
        w = torch.randn(n, k, generator=g) / k ** 0.5
        if fmt == "dense":
            out.append(Linear(f"m{i}", w, None, "dense", None, KERNELS, torch.float32))
        elif fmt == "fp8":
            q, s = quant_fp8_block(w, block, scale_fmt="ue8m0")
            out.append(Linear(f"m{i}", q, s, "fp8", block, KERNELS, torch.float32))
        else:
            q, s = quant_mxfp4(w)
            out.append(Linear(f"m{i}", q, s, "mxfp4", block, KERNELS, torch.float32))
    return out


@pytest.mark.parametrize("fmt,block", [("dense", None), ("fp8", (32, 32)), ("fp8", (128, 128)), ("mxfp4", None)])
@pytest.mark.parametrize("t", [1, 5])
def test_merged_product_gives_each_members_output(fmt, block, t):
    outs = [256, 128, 96] if block != (128, 128) else [256, 128, 80]  # the last need not fill its scale block
    ms = members(fmt, outs, 192, block or (32, 32))
    x = torch.randn(t, 192, generator=torch.Generator().manual_seed(1))
    want = [m(x) for m in ms]  # before grouping: each member's own weights
    group = LinearGroup(ms)
    assert group.merged
    got = group(x)
    assert [tuple(y.shape) for y in got] == [(t, n) for n in outs]
    for y, w in zip(got, want):
        torch.testing.assert_close(y, w, rtol=1e-5, atol=1e-5)
    for i, w in enumerate(want):  # a member alone: the merged product, sliced
        torch.testing.assert_close(group.part(i)(x), w, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ms[i](x), w, rtol=1e-5, atol=1e-5)  # the member over its row view


def test_members_read_the_stacked_bytes():
    ms = members("fp8", [64, 32], 64)
    group = LinearGroup(ms)
    base = group.linear.weight
    assert ms[0].weight.data_ptr() == base.data_ptr()
    assert ms[1].weight.data_ptr() == base[64:].data_ptr()
    assert ms[1].scale.data_ptr() == group.linear.scale[2:].data_ptr()  # 64 rows = 2 scale rows of 32


@pytest.mark.parametrize("why", ["misaligned fp8", "formats", "widths", "off"])
def test_members_that_cannot_stack_run_apart(why):
    if why == "misaligned fp8":  # 48 rows end inside a 32-row scale block: the scales cannot stack
        ms = members("fp8", [48, 32], 64)
    elif why == "formats":
        ms = members("fp8", [64], 64) + members("dense", [32], 64)
    elif why == "widths":
        ms = members("dense", [64], 64) + members("dense", [32], 96)
    else:
        ms = members("dense", [64, 32], 64)
    weights = [m.weight for m in ms]
    group = LinearGroup(ms, merge=why != "off")
    assert not group.merged
    assert all(m.weight is w for m, w in zip(ms, weights))  # untouched
    x = torch.randn(3, ms[0].weight.shape[1] * (2 if ms[0].fmt == "mxfp4" else 1))
    if why != "widths":
        got = group(x)
        assert all(torch.equal(y, m(x)) for y, m in zip(got, ms))
        assert group.part(1) is ms[1]


@pytest.mark.parametrize("quant", ["fp8", "fp4"])
def test_v41_merges_its_projections_and_keeps_its_logits(quant, monkeypatch):
    """The tiny V4.1 checkpoint (32 x 32 FP8 blocks) merges wq_a with wkv on every layer, wq_b with the indexer's
    wq_b on index layers, the ratio-2 compressors' wkv with wgate and the shared expert's w1 with w3; its logits are
    those of the model with every projection apart."""
    from deepinfer_models.layers import linear as linear_mod
    from deepinfer_models.deepseek_v41.loading import load_deepseek_v41
    from tests.models.v41_helpers import full_logits, prompt, tiny_ckpt

    d = tiny_ckpt("flash" if quant == "fp8" else "mixed", quant)
    monkeypatch.setattr(linear_mod, "MERGE_PROJECTIONS", True)
    merged = load_deepseek_v41(d, dtype=torch.float32)
    attns = [layer["attn"] for layer in merged.layers]
    assert all(a.qkv_a.merged for a in attns)
    assert any(a.indexer is not None for a in attns)
    assert all(a.q_b.merged == (a.indexer is not None) for a in attns)
    ratio2 = [a.compressor for a in attns if a.compressor is not None and a.compressor.ratio == 2]
    assert ratio2 and all(c.w_both is not None for c in ratio2)  # the compressor's wkv and wgate, stacked
    assert all(layer["ffn"].s13.merged for layer in merged.layers)  # the shared expert's w1 and w3
    monkeypatch.setattr(linear_mod, "MERGE_PROJECTIONS", False)
    apart = load_deepseek_v41(d, dtype=torch.float32)
    assert not any(layer["attn"].qkv_a.merged or layer["attn"].q_b.merged for layer in apart.layers)
    assert not any(a.compressor.w_both is not None for a in (layer["attn"] for layer in apart.layers) if a.compressor)
    assert not any(layer["ffn"].s13.merged for layer in apart.layers)
    ids = prompt(80, seed=4)
    torch.testing.assert_close(full_logits(merged, ids), full_logits(apart, ids), rtol=1e-5, atol=1e-5)


def test_v4_merges_its_projections_and_keeps_its_logits(tmp_path, monkeypatch):
    """The tiny V4 checkpoint in bf16 (its FP8 blocks are 128 rows, wider than its projections): wq_a with wkv on
    every layer, wq_b with the indexer's wq_b on CSA layers, the shared expert's w1 with w3; logits as the model with
    every projection apart."""
    from deepinfer_models.layers import linear as linear_mod
    from deepinfer_models.deepseek_v4.checkpoint_writer import write_tiny_v4_checkpoint
    from deepinfer_models.deepseek_v4.loading import load_deepseek_v4
    from tests.models.v41_helpers import full_logits, prompt

    d = write_tiny_v4_checkpoint(tmp_path / "v4", quant="none", seed=2, tokenizer=False)
    monkeypatch.setattr(linear_mod, "MERGE_PROJECTIONS", True)
    merged = load_deepseek_v4(d, dtype=torch.float32)
    attns = [layer["attn"] for layer in merged.layers]
    assert all(a.qkv_a.merged for a in attns) and any(a.indexer is not None for a in attns)
    assert all(a.q_b.merged == (a.indexer is not None) for a in attns)
    assert all(layer["ffn"].s13.merged for layer in merged.layers)
    monkeypatch.setattr(linear_mod, "MERGE_PROJECTIONS", False)
    apart = load_deepseek_v4(d, dtype=torch.float32)
    assert not any(layer["ffn"].s13.merged for layer in apart.layers)
    ids = prompt(70, seed=5)
    torch.testing.assert_close(full_logits(merged, ids), full_logits(apart, ids), rtol=1e-5, atol=1e-5)
