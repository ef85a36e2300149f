"""KV-cache specs: what per-request state each layer needs (ARCHITECTURE.md section 4).

Specs are frozen and hashable; layers with equal specs form one group with one
block table per request. All sizes are in tokens of the request's sequence.

- ``SlidingWindowSpec``: one entry per token, only the last ``window`` tokens are
  read; blocks entirely behind the window may be freed once processed.
- ``CompressedSpec``: one entry per ``ratio`` tokens (entry g covers tokens
  ``[g*ratio, (g+1)*ratio)``); grows with the sequence; a block of ``block_size``
  tokens holds ``block_size // ratio`` entries.
- ``StateSpec``: fixed-size per-request state (compressor buffers, rings); one
  slot per running request, not paged.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class KVCacheSpec:
    """Base class. ``entry_shape`` is the per-entry tensor shape, ``dtype`` its dtype."""

    entry_shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def entry_bytes(self) -> int:
        n = 1
        for s in self.entry_shape:
            n *= s
        return n * torch.empty((), dtype=self.dtype).element_size()


@dataclass(frozen=True)
class SlidingWindowSpec(KVCacheSpec):
    window: int = 128
    block_size: int = 16

    @property
    def entries_per_block(self) -> int:
        return self.block_size

    @property
    def page_bytes(self) -> int:
        return self.block_size * self.entry_bytes


@dataclass(frozen=True)
class CompressedSpec(KVCacheSpec):
    ratio: int = 4
    block_size: int = 64

    def __post_init__(self) -> None:
        if self.block_size % self.ratio:
            raise ValueError(f"compressed block_size {self.block_size} must be a multiple of ratio {self.ratio}")

    @property
    def entries_per_block(self) -> int:
        return self.block_size // self.ratio

    @property
    def page_bytes(self) -> int:
        return self.entries_per_block * self.entry_bytes


@dataclass(frozen=True)
class StateSpec(KVCacheSpec):
    """Per-request fixed state; ``entry_shape`` is the whole slot's shape."""

    @property
    def slot_bytes(self) -> int:
        return self.entry_bytes


PagedSpec = SlidingWindowSpec | CompressedSpec


# -- grouping (added for the KV manager) ------------------------------------------
@dataclass(frozen=True)
class KVCacheGroups:
    """Cache layers grouped by equal spec, in first-appearance order.

    ``paged_specs[g]`` is paged group ``g`` and ``paged_layers[g]`` the names of
    its cache layers (one page per block id per layer); likewise for the
    per-request state specs, which are not paged (one slot per running request).
    """

    paged_specs: tuple[PagedSpec, ...]
    paged_layers: tuple[tuple[str, ...], ...]
    state_specs: tuple[StateSpec, ...]
    state_layers: tuple[tuple[str, ...], ...]

    @property
    def layers_per_group(self) -> dict[int, int]:
        """Paged group index -> number of cache layers in it (what the memory budget needs)."""
        return {g: len(names) for g, names in enumerate(self.paged_layers)}


def group_cache_layers(layers: "list[tuple[str, KVCacheSpec]]") -> KVCacheGroups:
    """Group ``(cache_layer_name, spec)`` pairs: equal specs share one group.

    A model layer with several caches (sliding K=V, compressed entries, state)
    lists each as its own cache layer, e.g. ``("layers.3.swa", SlidingWindowSpec(...))``.
    """
    paged: dict[KVCacheSpec, list[str]] = {}
    state: dict[KVCacheSpec, list[str]] = {}
    seen: set[str] = set()
    for name, spec in layers:
        if name in seen:
            raise ValueError(f"cache layer {name!r} is listed twice")
        seen.add(name)
        if isinstance(spec, (SlidingWindowSpec, CompressedSpec)):
            paged.setdefault(spec, []).append(name)
        elif isinstance(spec, StateSpec):
            state.setdefault(spec, []).append(name)
        else:
            raise TypeError(
                f"cache layer {name!r} has spec {type(spec).__name__}; expected SlidingWindowSpec, CompressedSpec or StateSpec"
            )
    return KVCacheGroups(
        paged_specs=tuple(paged),
        paged_layers=tuple(tuple(v) for v in paged.values()),
        state_specs=tuple(state),
        state_layers=tuple(tuple(v) for v in state.values()),
    )
