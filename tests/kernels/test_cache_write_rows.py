"""``cache.write_rows``: the sync-free reference equals the boolean-mask store it replaces, bit for bit;
bad operands raise clear errors; ``static_index.write_rows`` runs the bound op; and the Triton kernel,
run in Triton's CPU interpreter, writes what the reference writes."""
from __future__ import annotations


import pytest
import torch

from deepinfer_core.kernels.ops.cache import _gen, check_write_rows, write_rows
from deepinfer_core.kernels.registry import get_registry


def bits(t: torch.Tensor) -> torch.Tensor:
    """Raw bits of a float tensor (equality then also covers -0.0 and NaN payloads)."""
    if t.is_floating_point():
        return t.contiguous().view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
    return t


def masked(cache, slots, rows, keep):
    """The form the op replaces (it syncs the host on a GPU): ``cache[slots[keep]] = rows[keep]``, negative slots
    never written."""
    keep = slots >= 0 if keep is None else keep & (slots >= 0)
    out = cache.clone()
    out[slots[keep]] = rows[keep].to(cache.dtype)
    return out


def test_generated_cases_match_the_masked_store():
    n = 0
    for dtype in (torch.float32, torch.bfloat16):
        for seed in (0, 1, 2):
            for (cache, slots, rows, keep), _ in _gen(dtype, "cpu", seed):
                want = masked(cache, slots, rows, keep)
                got = cache.clone()
                assert write_rows(got, slots, rows, keep) is got  # in place, returns the cache
                assert torch.equal(bits(got), bits(want)), (dtype, seed, n)
                n += 1
    assert n == 2 * 3 * 15


@pytest.mark.parametrize("cache_dtype,rows_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.float32),
                                                    (torch.float32, torch.bfloat16), (torch.float16, torch.float32),
                                                    (torch.float8_e4m3fn, torch.float32), (torch.long, torch.long),
                                                    (torch.int32, torch.long)])
def test_random_cases_match_the_masked_store(cache_dtype, rows_dtype):
    g = torch.Generator().manual_seed(3)
    for trial in range(30):
        n = int(torch.randint(1, 70, (1,), generator=g))
        k = int(torch.randint(0, n + 1, (1,), generator=g))
        e = [(), (1,), (5,), (2, 3), (64,)][trial % 5]
        cache = (torch.randn(n, *e, generator=g) * 50).to(cache_dtype)
        rows = (torch.randn(k, *e, generator=g) * 50).to(rows_dtype)
        slots = torch.randperm(n, generator=g)[:k]
        slots[torch.rand(k, generator=g) < trial / 30] = -1  # from all kept to (almost) none kept
        keep = None if trial % 3 else (slots >= 0) & (torch.rand(k, generator=g) < 0.5)
        got = cache.clone()
        write_rows(got, slots, rows, keep)
        assert torch.equal(bits(got), bits(masked(cache, slots, rows, keep))), trial


def test_flat_views_as_the_models_pass_them():
    """``ring.view(-1, E)`` (compressor rings) and ``history.view(-1)`` (Engram ids) write through to the state."""
    g = torch.Generator().manual_seed(4)
    ring = torch.randn(3, 8, 6, generator=g)
    slots = torch.tensor([5, -1, 17, 23])
    rows = torch.randn(4, 6, generator=g)
    want = ring.clone()
    want.view(-1, 6)[torch.tensor([5, 17, 23])] = rows[torch.tensor([0, 2, 3])]
    write_rows(ring.view(-1, 6), slots, rows)
    assert torch.equal(ring, want)
    history = torch.randint(0, 1000, (4, 16), generator=g)
    ids = torch.randint(0, 1000, (5,), generator=g)
    slots = torch.tensor([0, 17, 33, 63, 2])
    keep = torch.tensor([True, True, False, True, False])
    want = history.clone()
    want.view(-1)[slots[keep]] = ids[keep]
    write_rows(history.view(-1), slots, ids, keep)
    assert torch.equal(history, want)


def test_nothing_kept_leaves_the_cache_unchanged():
    cache = torch.randn(6, 4)
    before = cache.clone()
    write_rows(cache, torch.tensor([-1, -1, -1]), torch.randn(3, 4))
    write_rows(cache, torch.tensor([1, 2, 3]), torch.randn(3, 4), torch.zeros(3, dtype=torch.bool))
    write_rows(cache, torch.zeros(0, dtype=torch.long), torch.zeros(0, 4))
    assert torch.equal(bits(cache), bits(before))
    write_rows(torch.zeros(0, 4), torch.tensor([-1, -1]), torch.randn(2, 4))  # N == 0
    # a kept row whose slot is -1 is not written either (no wrap to the last row)
    write_rows(cache, torch.tensor([-1, -1]), torch.randn(2, 4), torch.ones(2, dtype=torch.bool))
    assert torch.equal(bits(cache), bits(before))


@pytest.mark.parametrize("args,err,words", [
    ((torch.zeros(4, 3), torch.tensor([0, 1]), torch.zeros(2, 4)), ValueError, "rows must be [K, *E]"),
    ((torch.zeros(4, 3), torch.tensor([0, 1]), torch.zeros(3, 3)), ValueError, "rows must be [K, *E]"),
    ((torch.zeros(4, 2, 3), torch.tensor([0]), torch.zeros(1, 3, 2)), ValueError, "row shape (2, 3)"),
    ((torch.zeros(8), torch.tensor([0, 1]), torch.zeros(2, 1)), ValueError, "rows must be [K, *E]"),
    ((torch.zeros(4, 3), torch.tensor([[0, 1]]), torch.zeros(2, 3)), ValueError, "slots must be 1-D"),
    ((torch.zeros(4, 3), torch.tensor(1), torch.zeros(1, 3)), ValueError, "slots must be 1-D"),
    ((torch.zeros(4, 3), torch.tensor([0.0, 1.0]), torch.zeros(2, 3)), TypeError, "slots must be an integer"),
    ((torch.zeros(()), torch.tensor([0]), torch.zeros(1)), ValueError, "cache must be [N, *E]"),
    ((torch.zeros(4, 3), torch.tensor([0, 1]), torch.zeros(2, 3), torch.tensor([True])), ValueError,
     "keep must have the slots' shape"),
    ((torch.zeros(4, 3), torch.tensor([0, 1]), torch.zeros(2, 3), torch.tensor([1, 0])), TypeError,
     "keep must be a bool"),
])
def test_bad_operands_raise_clear_errors(args, err, words):
    with pytest.raises(err, match="cache.write_rows") as info:
        check_write_rows(*args) if len(args) == 4 else check_write_rows(*args, None)
    assert words in str(info.value)
    with pytest.raises(err):
        write_rows(*args)


def test_registered_and_passes_the_shared_harness():
    from deepinfer_core.testing.conformance import check_impl

    reg = get_registry()
    assert reg.op("cache.write_rows").reference is write_rows
    assert check_impl("cache.write_rows", "reference", seeds=(0, 1)) == 2 * 2 * 15


def test_static_index_write_rows_runs_the_bound_op(monkeypatch):
    """``write_rows`` (every model cache write) calls the op a model bound at load, the reference by default."""
    from deepinfer_models.layers import static_index

    monkeypatch.setattr(static_index, "_write_rows_op", static_index._write_rows_op)  # restored afterwards
    assert static_index._write_rows_op is write_rows
    seen = []
    static_index.use_kernels({"norm.rms": None})  # a table without the op: unchanged
    assert static_index._write_rows_op is write_rows
    static_index.use_kernels({"cache.write_rows": lambda *a: seen.append(a)})
    cache, slots, rows = torch.zeros(3, 2), torch.tensor([1]), torch.ones(1, 2)
    assert static_index.write_rows(cache, slots, rows) is None
    assert len(seen) == 1 and seen[0][0] is cache and seen[0][3] is None


def test_model_load_binds_its_resolved_op(monkeypatch):
    from deepinfer_models.deepseek_v4.model import KERNEL_OPS as V4_OPS
    from deepinfer_models.deepseek_v41.model import KERNEL_OPS as V41_OPS
    from deepinfer_models.layers import static_index

    assert "cache.write_rows" in V4_OPS and "cache.write_rows" in V41_OPS
    from deepinfer_models.deepseek_v4 import model as v4

    monkeypatch.setattr(static_index, "_write_rows_op", None)
    monkeypatch.setattr(v4, "make_linear_factory", lambda *a: None)  # only the kernel table is under test
    monkeypatch.setattr(v4, "rope_tables", lambda *a: None)
    base = v4.DeepseekCausalLMBase()
    base.kernel_ops = ("cache.write_rows",)
    weights = {"embed.weight": torch.zeros(4, 2), "head.weight": torch.zeros(4, 2), "norm.weight": torch.ones(2)}
    base._setup(None, weights, torch.float32, "cpu", None, None)
    assert static_index._write_rows_op is write_rows  # DEEPINFER_KERNELS=reference in the tests


# -- the Triton kernel in Triton's CPU interpreter ---------------------------------------------------
_INTERPRETED = r"""
import torch
from deepinfer_core.kernels.ops.cache import _gen, write_rows as ref
from deepinfer_nvidia.kernels import triton_cache as tc

def bits(t):
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]) if t.is_floating_point() else t

def check(cache, slots, rows, keep, what, view=lambda t: t):
    # the kernel on view(a copy of cache): a strided view keeps its strides (clone() would not)
    if rows.dtype == torch.float32 and cache.dtype in (torch.bfloat16, torch.float16):
        # the interpreter truncates fp32 -> bf16 (a GPU rounds to nearest even, as torch): use rows
        # the narrow dtype holds exactly, so both roundings agree; the GPU test covers the rest
        rows = rows.to(cache.dtype).float()
    want, got = cache.clone(), cache.clone()
    ref(view(want), slots, rows, keep)
    tc._launch(view(got), slots, rows, keep)
    assert torch.equal(bits(got), bits(want)), what

n = 0
for dtype in (torch.float32, torch.bfloat16, torch.float16):
    for seed in (0, 1):
        for (cache, slots, rows, keep), _ in _gen(dtype, "cpu", seed):
            check(cache, slots, rows, keep, (dtype, seed, n))
            n += 1
g = torch.Generator().manual_seed(5)
big = torch.randn(40, 48, generator=g)
slots = torch.tensor([3, -1, 39, 0, 17, -1, 22, 5])
keep = torch.tensor([True, True, True, False, True, True, True, False])
rows = torch.randn(8, 32, generator=g)
cols = lambda t: t[:, 8:40]  # noqa: E731  (rows of 32 at a row stride of 48)
check(big, slots, rows, None, "row-strided cache", cols)
kb = torch.zeros(8, dtype=torch.bool)
kb[::2] = keep[::2] & (slots[::2] >= 0)
kb[1::2] = ~kb[::2]  # what a kernel ignoring keep's stride would read
check(big, slots[::2], torch.randn(16, 32, generator=g)[::4], kb[::2], "strided slots, rows and keep", cols)
check(big, slots, rows.view(8, 4, 8), keep & (slots >= 0), "[N, 4, 8] rows at stride 48", lambda t: t.view(40, 6, 8)[:, 1:5])
assert not tc._row_contiguous(big.view(40, 6, 8)[:, ::2]) and tc._row_contiguous(big.view(40, 6, 8)[:, 1:5])
wide = torch.randn(30, 3000, generator=g)  # several column tiles
check(wide, torch.tensor([29, 1, -1]), torch.randn(3, 3000, generator=g), None, "column tiles")
hist = torch.randint(0, 10 ** 6, (300,), generator=g)  # 1-D, many rows per program
s = torch.randperm(300, generator=g)[:200]
s[::7] = -1
check(hist, s, torch.randint(0, 10 ** 6, (200,), generator=g), None, "engram history")
check(hist.int(), s.int(), torch.randint(0, 10 ** 6, (200,), generator=g), s >= 0, "int32 ids and slots")
print("INTERPRETED", n + 6)
"""


def test_triton_kernel_in_the_interpreter(run_interpreted):
    """The kernel against the reference in ``TRITON_INTERPRET=1`` (its own process: the flag is read when
    the kernel is decorated). Skipped when triton is not installed."""
    run_interpreted(_INTERPRETED, "INTERPRETED 96")


def test_triton_wrapper_on_host_tensors_is_the_reference():
    """Without a GPU the provider hands its operands to the reference; bad operands raise the same errors."""
    pytest.importorskip("triton")
    from deepinfer_nvidia.kernels import triton_cache

    g = torch.Generator().manual_seed(6)
    cache, rows = torch.randn(10, 4, generator=g), torch.randn(3, 4, generator=g)
    slots = torch.tensor([4, -1, 9])
    got = triton_cache.write_rows(cache.clone(), slots, rows)
    assert torch.equal(got, masked(cache, slots, rows, None))
    assert not triton_cache.supports(cache, slots, rows)
    with pytest.raises(ValueError, match="slots must be 1-D"):
        triton_cache.write_rows(cache, slots[None], rows)
