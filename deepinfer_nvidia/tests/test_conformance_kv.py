"""``kv.sliding_slots`` / ``kv.compressed_slots`` (Triton, ``triton_kv.py``) against their references on the GPU
(skipped without one): exact integers at V4.1 decode and prefill sizes (window 128, ratio 1/2/4/128 reads up to
8192 entries wide, 64-token blocks), int32 inputs, no host synchronisation, and capture in a CUDA graph replayed
with new positions. The shared harness in ``test_conformance.py`` runs the ops' own generated cases too."""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")


@pytest.fixture(scope="module")
def reg():
    from deepinfer_core.kernels.registry import get_registry
    from deepinfer_core.kernels.resolve import ensure_platform_kernels
    from deepinfer_nvidia.platform import NvidiaPlatform

    r = get_registry()
    ensure_platform_kernels(r, NvidiaPlatform())
    return r


def _step(b: int, t: int, w: int, bs: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    table = torch.randperm(8 * b * w, generator=g)[:b * w].view(b, w)
    seq = torch.sort(torch.randint(0, b, (t,), generator=g)).values
    pos = torch.randint(0, w * bs, (t,), generator=g)
    nwb = torch.where(torch.rand(t, generator=g) < 0.3, torch.randint(0, w * bs, (t,), generator=g), 0)
    floor = torch.where(torch.rand(t, generator=g) < 0.2, torch.randint(0, w * bs, (t,), generator=g), 0)
    return [a.cuda() for a in (table, seq, pos, nwb, floor)]


def _same(got, want):
    for a, b in zip(got, want, strict=True):
        assert a.dtype == torch.long and torch.equal(a.cpu(), b.cpu())


@pytest.mark.parametrize("b,t", [(1, 1), (64, 64), (2, 8192)])
@pytest.mark.parametrize("int32", [False, True])
def test_sliding_slots(reg, b, t, int32):
    from deepinfer_core.kernels.ops.kv import sliding_slots

    table, seq, pos, nwb, floor = _step(b, t, 80, 64, t)
    if int32:
        table, seq, pos = table.int(), seq.int(), pos.int()
    fn = reg.impl("kv.sliding_slots", "triton")
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = fn(table, seq, pos, nwb, floor, 64, 128)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    _same(got, sliding_slots(table, seq, pos, nwb, floor, 64, 128))


@pytest.mark.parametrize("b,t", [(1, 1), (64, 64), (2, 8192)])
@pytest.mark.parametrize("ratio,width", [(1, 8192), (2, 4096), (4, 2048), (128, 64), (4, 0)])
def test_compressed_slots(reg, b, t, ratio, width):
    from deepinfer_core.kernels.ops.kv import compressed_slots

    table, seq, pos, nwb, _ = _step(b, t, 80, 64, t + ratio)
    fn = reg.impl("kv.compressed_slots", "triton")
    epb = max(1, 64 // ratio)
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = fn(table, seq, pos, nwb, ratio, epb, 64, width)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    _same(got, compressed_slots(table, seq, pos, nwb, ratio, epb, 64, width))


def test_captured_and_replayed_with_new_positions(reg):
    from deepinfer_core.kernels.ops.kv import compressed_slots, sliding_slots
    from deepinfer_nvidia.graphs import CudaGraphRunner

    sl, cp = reg.impl("kv.sliding_slots", "triton"), reg.impl("kv.compressed_slots", "triton")

    def step(table, seq, pos, nwb, floor):
        return sl(table, seq, pos, nwb, floor, 64, 128) + cp(table, seq, pos, nwb, 4, 16, 64, 512)

    runner = CudaGraphRunner(step)
    for seed in (1, 2, 3):
        args = _step(8, 8, 32, 64, seed)
        out = runner(*args)
        want = sliding_slots(*args, 64, 128) + compressed_slots(*args[:4], 4, 16, 64, 512)
        _same(out, want)
    assert runner.num_graphs == 1
