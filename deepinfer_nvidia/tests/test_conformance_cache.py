"""``cache.write_rows[triton]`` against the reference on the GPU (skipped without one).

    python3 -m pytest -q deepinfer_nvidia/tests/test_conformance_cache.py

A copy must be exact, so every check compares raw bits (NaN-safe). Caches start poisoned (NaN for
floats, a sentinel for ints), so a row the kernel should not touch or forgot to write shows; every
check builds fresh inputs. Covered: the shared harness on the op's own cases; model widths (SWA
entries 512 wide, compressor rings through ``ring.view(-1, E)``, the Engram id history through
``history.view(-1)``), keep masks, dtype casts (fp32 -> bf16 must round to nearest even, as
``Tensor.to``), strided operands, the hand-offs (non-contiguous cache rows, int rows into floats), skipped
out-of-range slots (no wild store), no host sync, and capture in a CUDA graph replayed with new
slots, rows and keep masks, for the kernel, the reference and the model-side ``write_rows``.
"""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")

OP = "cache.write_rows"


@pytest.fixture(scope="module")
def reg():
    from deepinfer_core.kernels.registry import get_registry
    from deepinfer_core.kernels.resolve import ensure_platform_kernels
    from deepinfer_nvidia.platform import NvidiaPlatform

    r = get_registry()
    ensure_platform_kernels(r, NvidiaPlatform())
    return r


@pytest.fixture(scope="module")
def fn(reg):
    return reg.impl(OP, "triton")


def bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().contiguous().cpu()
    if t.is_floating_point():
        return t.view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
    return t


def assert_same(out: torch.Tensor, ref: torch.Tensor, what="") -> None:
    assert out.shape == ref.shape and out.dtype == ref.dtype, (what, out.shape, ref.shape, out.dtype, ref.dtype)
    a, b = bits(out), bits(ref)
    assert torch.equal(a, b), f"{what}: {int((a != b).sum())} of {a.numel()} elements differ from the reference"


def poisoned(shape, dtype) -> torch.Tensor:
    """A GPU cache whose every element is NaN (floats) or -7 (ints), with a few real rows."""
    if dtype.is_floating_point:
        c = torch.full(shape, float("nan"), dtype=dtype, device="cuda")
        c[: shape[0] // 3] = torch.randn(shape[0] // 3, *shape[1:], device="cuda").to(dtype)
    else:
        c = torch.full(shape, -7, dtype=dtype, device="cuda")
    return c


def case(g, n, k, e, rows_dtype, pattern="some"):
    """slots [K] (distinct in [0, N), some -1), rows [K, *E] on the GPU."""
    slots = torch.randperm(n, generator=g)[:k]
    if pattern == "some":
        slots[torch.rand(k, generator=g) < 0.3] = -1
    elif pattern == "none":
        slots[:] = -1
    if rows_dtype.is_floating_point:
        rows = torch.randn(k, *e, generator=g).to(rows_dtype)
    else:
        rows = torch.randint(0, 129280, (k, *e), generator=g).to(rows_dtype)
    return slots.cuda(), rows.cuda()


def check(fn, cache, slots, rows, keep=None, what="") -> None:
    """``fn`` on ``cache`` (in place) against the reference on a host copy taken before."""
    from deepinfer_core.kernels.ops.cache import write_rows as ref

    want = ref(cache.cpu().clone(), slots.cpu(), rows.cpu(), None if keep is None else keep.cpu())
    out = fn(cache, slots, rows, keep)
    assert out is cache
    assert_same(cache, want, what)


def test_harness(reg):
    from deepinfer_core.testing.conformance import check_impl

    n = check_impl(OP, "triton", "cuda", dtypes=(torch.float32, torch.bfloat16, torch.float16), seeds=(0, 1, 2, 3),
                   registry=reg)
    assert n == 3 * 4 * 15


def test_resolves_to_triton_in_both_modes(reg):
    from deepinfer_core.kernels.mode import kernel_mode
    from deepinfer_nvidia.platform import NvidiaPlatform

    plat = NvidiaPlatform()
    for bi in (False, True):
        with kernel_mode(batch_invariant=bi):
            assert reg.resolve(OP, plat.default_providers)[0] == "triton", bi


@pytest.mark.parametrize("cache_dtype,rows_dtype", [(torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32),
                                                    (torch.float32, torch.float32), (torch.float32, torch.bfloat16),
                                                    (torch.float16, torch.float32)])
@pytest.mark.parametrize("k", [1, 4, 8, 64, 513, 4096])
@pytest.mark.parametrize("pattern", ["all", "some", "none"])
def test_swa_width(fn, cache_dtype, rows_dtype, k, pattern):
    """SWA entries: cache [blocks * 64, 512], one row per token of the step (slot -1: prefix-cached)."""
    g = torch.Generator().manual_seed(k)
    n = 8192
    slots, rows = case(g, n, k, (512,), rows_dtype, pattern)
    if rows_dtype == torch.float32:
        rows = rows * 3.3  # values between bf16 neighbours, ties included by chance: rounding is checked
    check(fn, poisoned((n, 512), cache_dtype), slots, rows, what=f"swa k={k}")
    keep = (slots >= 0) & (torch.rand(k, generator=g) < 0.5).cuda()
    check(fn, poisoned((n, 512), cache_dtype), slots, rows, keep, what=f"swa k={k} keep")


def test_fp32_to_bf16_rounds_to_nearest_even(fn):
    """Exact halfway fp32 values: round-to-nearest-even (torch) and truncation or round-half-up differ."""
    base = (0x3F80 + torch.arange(256, dtype=torch.int32)) << 16  # 256 normal bf16 values from 1.0 (raw bits)
    half = (base | 0x8000).view(torch.float32)  # exactly halfway to the next bf16 value
    rows = torch.stack([half, -half, (base | 0x8001).view(torch.float32), (base | 0x7FFF).view(torch.float32)])
    check(fn, poisoned((8, 256), torch.bfloat16), torch.tensor([6, 1, 3, 0]).cuda(), rows.cuda(), what="ties")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_compressor_ring_view(fn, dtype):
    """``write_rows(ring.view(-1, 2d), slot * RING + pos % RING, both, valid)``: the ring [S, RING, 2d] is updated."""
    g = torch.Generator().manual_seed(11)
    s, ring_len, width = 9, 8, 2 * 512
    ring = poisoned((s, ring_len, width), dtype)
    flat = torch.randperm(s * ring_len, generator=g)[:20]
    valid = torch.rand(20, generator=g) < 0.7
    rows = torch.randn(20, width, generator=g).to(dtype)
    want = ring.cpu().clone()
    want.view(-1, width)[flat[valid]] = rows[valid]
    fn(ring.view(-1, width), flat.cuda(), rows.cuda(), valid.cuda())
    assert_same(ring, want, "ring")


@pytest.mark.parametrize("t", [1, 7, 300])
def test_engram_history_view(fn, t):
    """``write_rows(history.view(-1), slot * 16 + pos % 16, input_ids, valid)``: int64 scalars into [S, 16]."""
    g = torch.Generator().manual_seed(12 + t)
    history = torch.randint(0, 129280, (33, 16), generator=g).cuda()
    flat = torch.randperm(33 * 16, generator=g)[:t]
    ids = torch.randint(0, 129280, (t,), generator=g)
    valid = torch.rand(t, generator=g) < 0.8
    want = history.cpu().clone()
    want.view(-1)[flat[valid]] = ids[valid]
    fn(history.view(-1), flat.cuda(), ids.cuda(), valid.cuda())
    assert_same(history, want, "history")
    check(fn, history.view(-1), flat.cuda(), ids.cuda(), what="history, keep = slots >= 0")


def test_other_shapes_and_dtypes(fn):
    g = torch.Generator().manual_seed(13)
    for n, e, k in [(40, (2, 3), 9), (300, (), 200), (64, (1,), 64), (17, (4096,), 5), (5, (3000,), 3), (2, (1,), 2)]:
        for cd, rd in [(torch.float32, torch.float32), (torch.bfloat16, torch.float32), (torch.int64, torch.int64),
                       (torch.int32, torch.int64), (torch.float16, torch.bfloat16)]:
            slots, rows = case(g, n, k, e, rd)
            check(fn, poisoned((n, *e), cd), slots, rows, what=f"{n}x{e} k={k} {rd}->{cd}")
            check(fn, poisoned((n, *e), cd), slots.int(), rows, slots >= 0, what=f"int32 slots {n}x{e}")
    # strided operands: cache rows at a row stride, every other slot / row / keep entry
    big = poisoned((50, 700), torch.bfloat16)
    slots, rows = case(g, 50, 16, (512,), torch.float32)
    keep = torch.rand(16, generator=g).cuda() < 0.5
    check(fn, big[:, 100:612], slots[::2], rows[::2], keep[::2] & (slots[::2] >= 0), what="strided")
    # empty calls: nothing written, nothing launched that could fault
    c = poisoned((4, 8), torch.float32)
    check(fn, c, torch.zeros(0, dtype=torch.long, device="cuda"), torch.zeros(0, 8, device="cuda"), what="K = 0")
    check(fn, poisoned((0, 8), torch.float32), torch.full((3,), -1, device="cuda"), torch.zeros(3, 8, device="cuda"),
          what="N = 0")


def test_hand_offs_still_match(fn):
    """Operands the kernel does not cover run the reference: cache rows that are not contiguous runs, int rows
    into a float cache."""
    g = torch.Generator().manual_seed(14)
    slots, rows = case(g, 30, 6, (4, 8), torch.float32)
    base = poisoned((30, 8, 8), torch.float32)
    check(fn, base[:, ::2], slots, rows, what="non-contiguous cache rows")
    slots, rows = case(g, 30, 6, (64,), torch.int64)
    check(fn, poisoned((30, 64), torch.float32), slots, rows, what="int rows into a float cache")


def test_out_of_range_slots_are_skipped(fn):
    """A kept slot outside [0, N) is a contract violation; the kernel skips it instead of storing out of bounds."""
    base = poisoned((12, 16), torch.float32)
    cache = base[1:11]  # guard rows 0 and 11 around a 10-row cache
    before = base.cpu().clone()
    rows = torch.randn(4, 16, device="cuda")
    fn(cache, torch.tensor([10, 3, 11, -1], device="cuda"), rows, torch.tensor([True, True, True, True], device="cuda"))
    want = before.clone()
    want[1 + 3] = rows[1].cpu()
    assert_same(base, want, "out of range")


def test_no_host_sync(fn):
    g = torch.Generator().manual_seed(15)
    cache = poisoned((256, 512), torch.bfloat16)
    slots, rows = case(g, 256, 32, (512,), torch.float32)
    keep = slots >= 0
    fn(cache, slots, rows, keep)  # compile outside the checked region
    fn(cache, slots, rows, None)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn(cache, slots, rows, keep)
        fn(cache, slots, rows, None)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def _graph_replays(write, with_keep: bool, n=1024, k=48, e=(512,), dtype=torch.bfloat16, steps=5) -> None:
    """Capture ``write(cache, slots, rows, keep)`` once, then replay with new slots / rows / keep each step."""
    from deepinfer_core.kernels.ops.cache import write_rows as ref

    g = torch.Generator().manual_seed(16)
    rows_dtype = torch.float32 if dtype.is_floating_point else dtype
    cache = poisoned((n, *e), dtype)
    s_slots, s_rows = case(g, n, k, e, rows_dtype)
    s_keep = (s_slots >= 0) if with_keep else None
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (Triton compile) outside the capture, as CudaGraphRunner does
        for _ in range(2):
            write(cache, s_slots, s_rows, s_keep)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        write(cache, s_slots, s_rows, s_keep)
    for step in range(steps):
        slots, rows = case(g, n, k, e, rows_dtype, ["some", "all", "none"][step % 3])
        s_slots.copy_(slots)
        s_rows.copy_(rows)
        keep = None
        if with_keep:
            keep = (slots >= 0) & (torch.rand(k, generator=g) < 0.6).cuda()
            s_keep.copy_(keep)
        cache.copy_(poisoned((n, *e), dtype))
        want = ref(cache.cpu().clone(), slots.cpu(), rows.cpu(), None if keep is None else keep.cpu())
        graph.replay()
        torch.cuda.synchronize()
        assert_same(cache, want, f"replay {step}")


@pytest.mark.parametrize("with_keep", [False, True])
def test_graph_capture_kernel(fn, with_keep):
    _graph_replays(fn, with_keep)
    _graph_replays(fn, with_keep, n=700, k=300, e=(), dtype=torch.int64)  # Engram ids, many rows per program


@pytest.mark.parametrize("with_keep", [False, True])
def test_graph_capture_reference(with_keep):
    """The reference stays capturable too (the fallback of every other platform and of the hand-offs)."""
    from deepinfer_core.kernels.ops.cache import write_rows as ref

    _graph_replays(ref, with_keep)


def test_model_write_rows_runs_the_kernel_in_a_graph(reg, monkeypatch):
    """``static_index.write_rows`` bound to the resolved op (as model load does) captures and replays."""
    from deepinfer_core.kernels.resolve import resolve_kernels
    from deepinfer_models.layers import static_index
    from deepinfer_nvidia.platform import NvidiaPlatform

    monkeypatch.setattr(static_index, "_write_rows_op", static_index._write_rows_op)  # restored afterwards
    monkeypatch.delenv("DEEPINFER_KERNELS", raising=False)
    table = resolve_kernels([OP], NvidiaPlatform(), registry=reg)
    static_index.use_kernels(table)
    assert static_index._write_rows_op is reg.impl(OP, "triton")
    _graph_replays(lambda c, s, r, k: static_index.write_rows(c, s, r, k), True)
