"""The sync-free index helpers equal the boolean-mask / nonzero forms they replace, bit for bit."""
from __future__ import annotations

import pytest
import torch

from deepinfer_models.layers.static_index import compact, write_rows


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype.is_floating_point else t


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.long])
@pytest.mark.parametrize("kept", ["some", "none", "all"])
def test_write_rows_matches_masked_write(dtype, kept):
    g = torch.Generator().manual_seed(0)
    n, k = 16, 7
    cache = (torch.randn(n, 3, generator=g) * 4).to(dtype)
    slots = torch.randperm(n, generator=g)[:k]
    if kept == "some":
        slots[torch.tensor([0, 2, 5])] = -1
    elif kept == "none":
        slots[:] = -1
    rows = torch.randn(k, 3, generator=g) * 4
    want = cache.clone()
    keep = slots >= 0
    want[slots[keep]] = rows[keep].to(dtype)
    got = cache.clone()
    write_rows(got, slots, rows)
    assert torch.equal(_bits(got), _bits(want))


def test_write_rows_explicit_keep_and_flat_state():
    g = torch.Generator().manual_seed(1)
    state = torch.randn(4, 8, 5, generator=g)
    slots = torch.randint(0, 32, (6,), generator=g).unique()[:4]
    rows = torch.randn(slots.shape[0], 5, generator=g)
    keep = torch.tensor([True, False, True, False])[: slots.shape[0]]
    want = state.clone()
    want.view(-1, 5)[slots[keep]] = rows[keep]
    got = state.clone()
    write_rows(got.view(-1, 5), slots, rows, keep)
    assert torch.equal(got, want)


@pytest.mark.parametrize("size", [0, 1, 3, 5, 9])
def test_compact_is_static_nonzero(size):
    g = torch.Generator().manual_seed(2)
    for _ in range(20):
        mask = torch.rand(9, generator=g) < 0.4
        idx, valid = compact(mask, size)
        ref = mask.nonzero().squeeze(1)[:size]
        assert idx.shape == (size,) and valid.shape == (size,)
        assert int(valid.sum()) == ref.numel()
        assert torch.equal(idx[valid], ref)
        assert bool((idx[~valid] == 0).all())
