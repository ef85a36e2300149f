"""``stream.side``: run a piece of a layer that does not depend on the rest of it as a side branch.

A model calls ``branch = k["stream.side"](fn, *args)`` where ``fn(*args)`` reads only ``args`` (and weights), and
later ``branch.join()`` for its result: before anything reads that result or what the branch wrote (a cache row), and
before ``args`` may be freed. ``tests/models/test_side_branch_order.py`` checks a model's joins by deferring each
branch to its join.

What runs is exactly ``fn(*args)``: the same kernels on the same operands, so the result is the same bits on every
platform. The reference runs it at once, in order. A platform may instead run it beside the work issued between the
call and the join (a second stream forked from and joined back into the current one, which a captured graph holds
as two parallel paths), which pays where both branches are small launches that leave SMs
idle: the shared expert beside the routed experts at decode sizes (docs/performance.md, thirty-third pass).
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from deepinfer_core.kernels.spec import DEFAULT_TOLERANCES, OpSpec


class Joined:
    """A branch that has already run: ``join()`` returns its result."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def join(self) -> Any:
        return self.value


def side(fn: Callable[..., Any], *args: Any) -> Joined:
    """``stream.side`` reference: ``fn(*args)`` now; ``join()`` returns it."""
    if not callable(fn):
        raise TypeError(f"stream.side: the branch must be callable, got {type(fn).__name__}")
    return Joined(fn(*args))


def _mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x @ w1.t()) @ w2.t()


def _gen_side(dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    for t, d, f in [(1, 64, 96), (4, 256, 128), (33, 128, 512)]:
        x = torch.randn(t, d, generator=g).to(dtype).to(device)
        w1 = (torch.randn(f, d, generator=g) / d ** 0.5).to(dtype).to(device)
        w2 = (torch.randn(d, f, generator=g) / f ** 0.5).to(dtype).to(device)
        yield (_mlp, x, w1, w2), {}


def _compare_side(out: Joined, ref: Joined, dtype: torch.dtype) -> None:
    """Both branches joined: the results agree within the dtype's tolerance (the reference ran on the CPU)."""
    got, want = out.join(), ref.join()
    atol, rtol = DEFAULT_TOLERANCES[dtype]
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    torch.testing.assert_close(got.float().cpu(), want.float().cpu(), atol=atol, rtol=rtol)


OPS = [
    OpSpec("stream.side", side, _gen_side, compare=_compare_side,
           doc="fn(*args) as a branch beside the following work; join() returns its result"),
]
