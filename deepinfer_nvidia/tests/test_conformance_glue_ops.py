"""The step's glue ops on the GPU (skipped without one): ``moe.clamped_swiglu`` (``triton_swiglu.py``, the shared
expert's activation), ``index.entry_slots`` (``triton_entry_slots.py``, the cache slots of the top-k entries) and
``engram.window`` (``triton_engram_window.py``, the n-gram window of each token).

    python3 -m pytest -q deepinfer_nvidia/tests/test_conformance_glue_ops.py

The activation: shapes of the shared expert (F = 2048 in V4-Flash, 2304 in V4.1-Flash; 1..8192 tokens) and small
odd widths; gate and up contiguous or the two column halves of one merged ``w1 | w3`` product; bf16 and fp32.
Against the reference evaluated in float64 and rounded as it rounds (silu to the dtype, then the product): within 2
units in the last place (an fp32 exp may round the silu to the neighbouring bf16). The entry slots: exactly the
reference's, 1-8192 rows, N up to 8192 (1M context at ratio 128), k 512 and odd. The window: exactly the
reference's where valid (decode and prefill slices, positions near 0 and far past the ring).

Each launch runs on a NaN-poisoned allocator with host synchronisation raising; a token alone equals the same token
in a batch, bit for bit (both registrations say batch-invariant); a CUDA graph replay under programmatic dependent
launch, with fresh inputs, equals the eager launch.
"""
from __future__ import annotations

import pytest
import torch

from deepinfer_nvidia.tests.device_helpers import checked_call as _checked

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")


def _inputs(t: int, f: int, dtype: torch.dtype, merged: bool, seed: int):
    g = torch.Generator().manual_seed(seed)
    both = (8 * torch.randn(t, 2 * f, generator=g)).to(dtype).cuda()
    gate, up = both[:, :f], both[:, f:]
    return (gate, up) if merged else (gate.contiguous(), up.contiguous())


def _exact(gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
    """The reference's arithmetic with the silu in float64 (the kernel's own exp may differ from torch's by an
    fp32 ulp before the rounding to the dtype)."""
    gc = gate.double().clamp(max=limit)
    act = (gc / (1 + torch.exp(-gc))).to(gate.dtype)
    return (act.double() * up.double().clamp(-limit, limit)).to(gate.dtype)


def _launch(gate, up, limit):
    from deepinfer_nvidia.kernels.triton_swiglu import clamped_swiglu

    return _checked(clamped_swiglu, gate, up, limit)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("merged", [True, False])
@pytest.mark.parametrize("t,f", [(1, 2304), (7, 2048), (64, 2304), (8192, 2304), (3, 96), (2, 1)])
def test_clamped_swiglu_matches_the_reference(dtype, merged, t, f):
    from deepinfer_core.kernels.ops.moe import clamped_swiglu as reference

    gate, up = _inputs(t, f, dtype, merged, seed=t * 31 + f)
    out = _launch(gate, up, 10.0)
    assert out.dtype == dtype and out.shape == (t, f) and out.is_contiguous()
    want = _exact(gate, up, 10.0)
    ulp = torch.finfo(dtype).eps * want.double().abs().clamp(min=torch.finfo(dtype).tiny)
    err = (out.double() - want.double()).abs()
    assert bool((err <= 2 * ulp + 1e-30).all()), err.max()
    torch.testing.assert_close(out, reference(gate, up, 10.0), **({"atol": 2e-2, "rtol": 2e-2}
                                                                 if dtype == torch.bfloat16 else {}))


def test_swiglu_rows_are_batch_invariant_and_graphs_replay():
    """A token alone equals the token inside 64 (bit for bit); one graph captured under PDL, replayed with fresh
    merged inputs, equals the eager launch each time."""
    from deepinfer_nvidia.kernels import _common
    from deepinfer_nvidia.kernels.triton_swiglu import clamped_swiglu

    gate, up = _inputs(64, 2048, torch.bfloat16, True, seed=5)
    batch = _launch(gate, up, 10.0)
    for row in (0, 17, 63):
        assert torch.equal(_launch(gate[row:row + 1], up[row:row + 1], 10.0)[0], batch[row]), row
    assert _common.PDL  # the step's default: the launch carries the programmatic attribute on SM90+
    both = torch.empty(1, 4096, dtype=torch.bfloat16, device="cuda")
    both.copy_(torch.randn(1, 4096).bfloat16())
    clamped_swiglu(both[:, :2048], both[:, 2048:], 10.0)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = clamped_swiglu(both[:, :2048], both[:, 2048:], 10.0)
    for seed in range(3):
        fresh = (8 * torch.randn(1, 4096, generator=torch.Generator().manual_seed(40 + seed))).bfloat16().cuda()
        both.copy_(fresh)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, clamped_swiglu(fresh[:, :2048], fresh[:, 2048:], 10.0)), seed


def _slots_inputs(t: int, n: int, k: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    visible = torch.randint(0, 1 << 40, (t, n), generator=g)
    visible[torch.rand(t, n, generator=g) < 0.2] = -1
    sel = torch.randint(0, n, (t, k), generator=g)
    sel[torch.rand(t, k, generator=g) < 0.3] = -1
    return visible.cuda(), sel.cuda()


@pytest.mark.parametrize("t,n,k", [(1, 1, 1), (1, 4096, 512), (7, 8192, 512), (64, 2048, 512), (8192, 640, 512),
                                   (3, 100, 37)])
@pytest.mark.parametrize("strided", [False, True])
def test_entry_slots_match_the_reference(t, n, k, strided):
    from deepinfer_core.kernels.ops.indexer import entry_slots as reference
    from deepinfer_nvidia.kernels.triton_entry_slots import entry_slots

    visible, sel = _slots_inputs(t, n + 8, k + 8, seed=t + n + k)
    visible, sel = (visible[:, 8:], sel[:, 8:].clamp(max=n - 1)) if strided else \
        (visible[:, 8:].contiguous(), sel[:, 8:].clamp(max=n - 1).contiguous())
    out = _checked(entry_slots, visible, sel)
    assert out.dtype == torch.int64 and out.is_contiguous()
    assert torch.equal(out, reference(visible, sel))


def test_entry_slot_rows_are_batch_invariant_and_graphs_replay():
    from deepinfer_core.kernels.ops.indexer import entry_slots as reference
    from deepinfer_nvidia.kernels.triton_entry_slots import entry_slots

    visible, sel = _slots_inputs(64, 1024, 512, seed=9)
    batch = _checked(entry_slots, visible, sel)
    for row in (0, 31, 63):
        assert torch.equal(_checked(entry_slots, visible[row:row + 1], sel[row:row + 1])[0], batch[row]), row
    v1, s1 = _slots_inputs(1, 1024, 512, seed=10)
    entry_slots(v1, s1)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = entry_slots(v1, s1)
    for seed in range(3):
        fv, fs = _slots_inputs(1, 1024, 512, seed=20 + seed)
        v1.copy_(fv)
        s1.copy_(fs)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, reference(fv, fs)), seed


def _window_inputs(lens, starts, n, seed, cap=16):
    g = torch.Generator().manual_seed(seed)
    slots = torch.randperm(4 * len(lens) + 1, generator=g)[: len(lens)]
    pos = torch.cat([torch.arange(st, st + ln) for st, ln in zip(starts, lens)])
    start = torch.cat([torch.full((ln,), st) for st, ln in zip(starts, lens)])
    slot = torch.cat([torch.full((ln,), int(sl)) for sl, ln in zip(slots, lens)])
    ids = torch.randint(0, 129280, (pos.shape[0],), generator=g)
    history = torch.randint(0, 129280, (4 * len(lens) + 1, cap), generator=g)
    return [v.cuda() for v in (ids, pos, start, slot, history)]


@pytest.mark.parametrize("lens,starts", [([1], [0]), ([1] * 64, list(range(0, 6400, 100))), ([300, 1, 57], [0, 9, 2]),
                                         ([8192], [100])])
@pytest.mark.parametrize("n", [1, 3, 4])
def test_engram_window_matches_the_reference(lens, starts, n):
    from deepinfer_core.kernels.ops.engram import window_ids
    from deepinfer_nvidia.kernels.triton_engram_window import window

    args = _window_inputs(lens, starts, n, seed=n + len(lens))
    win, valid = _checked(window, *args, n)
    rw, rv = window_ids(*args, n)
    assert torch.equal(valid, rv) and torch.equal(torch.where(rv, win, 0), torch.where(rv, rw, 0))


def test_engram_window_rows_and_graphs():
    """A token's window alone (its own one-token slice) equals it inside a batch of 64 decode slices; a captured
    graph replayed with fresh positions and history equals the reference each time."""
    from deepinfer_core.kernels.ops.engram import window_ids
    from deepinfer_nvidia.kernels.triton_engram_window import window

    args = _window_inputs([1] * 64, list(range(3, 64 * 37, 37)), 4, seed=1)
    batch = _checked(window, *args, 4)
    for row in (0, 30, 63):
        one = [v[row:row + 1] for v in args[:4]] + [args[4]]
        w1, v1 = _checked(window, *one, 4)
        assert torch.equal(w1[0], batch[0][row]) and torch.equal(v1[0], batch[1][row]), row
    static = _window_inputs([1] * 8, list(range(0, 80, 10)), 4, seed=2)
    window(*static, 4)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = window(*static, 4)
    for seed in range(3):
        fresh = _window_inputs([1] * 8, [int(x) for x in torch.randint(0, 500, (8,))], 4, seed=10 + seed)
        for dst, src in zip(static, fresh):
            dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        rw, rv = window_ids(*fresh, 4)
        assert torch.equal(out[1], rv) and torch.equal(torch.where(rv, out[0], 0), torch.where(rv, rw, 0)), seed
