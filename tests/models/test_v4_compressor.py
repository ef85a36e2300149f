"""The paged CSA (ratio 4, overlapping) and HCA (ratio 128) compressors against float64 textbook pooling.

The compressor runs through real step metadata in several chunks (so its per-request ring state is
exercised across steps); every emitted entry is compared with a direct evaluation of MODEL_SPEC.md 2.5.
"""
from __future__ import annotations

import math

import pytest
import torch

from deepinfer_core.kernels.ops.rope import apply_rope, default_inv_freq
from deepinfer_core.kernels.resolve import resolve_kernels
from deepinfer_core.kv.spec import StateSpec
from deepinfer_core.runner.context import SeqSlice, build_step_context
from deepinfer_core.runner.executor import group_specs
from deepinfer_models.deepseek_v4.compressor import Compressor

OPS = ("gemm.dense", "gemm.dense_wide", "compress.softmax_pool", "norm.rms", "rope.interleaved", "norm.rms_rope")


def textbook_entry(x, wkv, wgate, ape, norm_w, ratio, overlap, w, d, inv_freq):
    """Entry w from the token projections, in float64 with plain loops over channels and slots."""
    kv = x @ wkv.T
    z = x @ wgate.T
    slots = []  # (position, channel offset)
    if overlap:
        slots += [(p, 0) for p in range((w - 1) * ratio, w * ratio) if p >= 0]
        slots += [(p, d) for p in range(w * ratio, (w + 1) * ratio)]
    else:
        slots += [(p, 0) for p in range(w * ratio, (w + 1) * ratio)]
    out = torch.zeros(d, dtype=torch.float64)
    for c in range(d):
        scores = [z[p, off + c] + ape[p % ratio, off + c] for p, off in slots]
        m = max(scores)
        ws = [math.exp(s - m) for s in scores]
        out[c] = sum(wt * kv[p, off + c] for wt, (p, off) in zip(ws, slots)) / sum(ws)
    rms = math.sqrt(float((out * out).mean()) + 1e-6)
    out = norm_w * out / rms
    return apply_rope(out[None], torch.tensor([w * ratio]), inv_freq)[0]


@pytest.mark.parametrize("ratio,overlap,length,chunks", [(4, True, 37, [5, 1, 1, 13, 17]), (128, False, 300, [100, 157, 43])])
def test_paged_compressor_matches_textbook(ratio, overlap, length, chunks):
    g = torch.Generator().manual_seed(ratio)
    D, d, c = 16, 8, 2 if overlap else 1
    w = {
        "cmp.wkv.weight": torch.randn(c * d, D, generator=g, dtype=torch.float64) / 4,
        "cmp.wgate.weight": torch.randn(c * d, D, generator=g, dtype=torch.float64) / 4,
        "cmp.ape": torch.randn(ratio, c * d, generator=g, dtype=torch.float64),
        "cmp.norm.weight": 1 + 0.1 * torch.randn(d, generator=g, dtype=torch.float64),
    }
    inv_freq = default_inv_freq(4, 160000.0).double()
    k = resolve_kernels(OPS)
    comp = Compressor("cmp", w, ratio, d, overlap, inv_freq, 1e-6, k, "cmp_cache", 128, torch.float64)
    specs = comp.specs()
    gspecs, cache_group, _ = group_specs(specs)
    caches = {}
    for name, spec in specs.items():
        shape = (1, *spec.entry_shape) if isinstance(spec, StateSpec) else (8 * spec.entries_per_block, *spec.entry_shape)
        caches[name] = torch.full(shape, float("nan"), dtype=spec.dtype)
    caches[comp.state_name].zero_()
    x = torch.randn(length, D, generator=g, dtype=torch.float64)
    table = [3, 1, 6, 2]  # non-contiguous physical blocks
    start = 0
    for n in chunks:
        ctx = build_step_context([SeqSlice(start, n, {0: table}, 0)], gspecs, cache_group, caches, torch.device("cpu"))
        comp(x[start:start + n], ctx)
        start += n
    assert start == length
    epb = 128 // ratio
    for e in range(length // ratio):
        got = caches["cmp_cache"][table[e * ratio // 128] * epb + e % epb]
        want = textbook_entry(x, w["cmp.wkv.weight"], w["cmp.wgate.weight"], w["cmp.ape"], w["cmp.norm.weight"],
                              ratio, overlap, e, d, inv_freq)
        # the compressor projects in fp32 by spec (MODEL_SPEC 3.3); structural mistakes would be O(1)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
