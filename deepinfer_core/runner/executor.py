"""Owns the cache tensors of a model and runs one step over ``SeqSlice``s.

Paged specs that compare equal form one group (one block table per request);
state specs get one row per request slot. The executor does not decide which
blocks a request owns: the caller (the engine's KV manager, or the minimal
driver in tests) passes block tables in every ``SeqSlice``.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from deepinfer_core.kv.spec import KVCacheSpec, StateSpec
from deepinfer_core.runner.context import SeqSlice, StepContext, TableRowCache, build_step_context
from deepinfer_core.runner.decode_graphs import DEFAULT_BATCH_SIZES, DecodeGraphs

# Ops the executor itself runs every step (the per-group slot metadata of runner/context.py); the engine
# resolves them for its platform like a model's ops.
STEP_KERNEL_OPS = ("kv.sliding_slots", "kv.compressed_slots")


def group_specs(specs: dict[str, KVCacheSpec]) -> tuple[dict[int, KVCacheSpec], dict[str, int], dict[int, list[str]]]:
    """Group equal paged specs. Returns (gid -> spec, cache name -> gid, gid -> cache names)."""
    gid_of_spec: dict[KVCacheSpec, int] = {}
    cache_group: dict[str, int] = {}
    members: dict[int, list[str]] = {}
    for name, spec in specs.items():
        if isinstance(spec, StateSpec):
            continue
        gid = gid_of_spec.setdefault(spec, len(gid_of_spec))
        cache_group[name] = gid
        members.setdefault(gid, []).append(name)
    return {g: s for s, g in gid_of_spec.items()}, cache_group, members


class PagedExecutor:
    def __init__(self, model, num_blocks: int, max_num_seqs: int, device: torch.device | str = "cpu",
                 extra_specs: dict[str, KVCacheSpec] | None = None, graph_runner: Callable | None = None,
                 graph_batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES, max_context: int = 4096,
                 max_query_len: int = 1, kernels: dict | None = None):
        """``extra_specs``: caches of a second model sharing the block tables (a draft model).
        ``graph_runner``: the platform's graph runner factory (``fn -> callable``, or None when the platform
        has none); with one, uniform decode steps (the same number of tokens, at most ``max_query_len``, for
        every request) run padded to ``graph_batch_sizes`` buckets from captured graphs (``decode_graphs.py``). State tensors get one scratch row (``scratch_state_slot``) for the
        padding requests. ``kernels``: the step-metadata ops (``STEP_KERNEL_OPS``) resolved for the platform;
        None runs their references."""
        self.model = model
        self.kernels = kernels
        self.device = torch.device(device)
        self.specs = {**model.kv_cache_specs(), **(extra_specs or {})}
        self.group_specs, self.cache_group, self.group_members = group_specs(self.specs)
        self.num_blocks, self.max_num_seqs = num_blocks, max_num_seqs
        self.caches: dict[str, torch.Tensor] = {}
        for name, spec in self.specs.items():
            if isinstance(spec, StateSpec):
                shape = (max_num_seqs + 1, *spec.entry_shape)  # + the padding requests' scratch row
            else:
                shape = (num_blocks * spec.entries_per_block, *spec.entry_shape)
            self.caches[name] = torch.zeros(shape, dtype=spec.dtype, device=self.device)
        self.scratch_state_slot = max_num_seqs
        self.row_cache = TableRowCache()  # packed block-table rows of eager steps, reused while unchanged
        self.graphs: DecodeGraphs | None = None
        if graph_runner is not None:
            graphs = DecodeGraphs(self, graph_runner, graph_batch_sizes, max_context, max_query_len=max_query_len)
            self.graphs = graphs if graphs.graphed is not None else None  # the platform declined

    def context(self, slices: list[SeqSlice]) -> StepContext:
        return build_step_context(slices, self.group_specs, self.cache_group, self.caches, self.device, self.kernels,
                                  self.row_cache)

    @torch.inference_mode()
    def run(self, input_ids: torch.Tensor, slices: list[SeqSlice]) -> torch.Tensor:
        """input_ids [T] (concatenated in slice order) -> hidden [T, D].

        A pure-decode step that fits a graph bucket replays a captured graph; its result is then only
        valid until the next step (the graph's static output)."""
        if self.graphs is not None and self.graphs.supports(slices):
            hidden = self.graphs.run(input_ids, slices)
            if hidden is not None:
                return hidden
        ctx = self.context(slices)
        return self.model.forward(input_ids.to(self.device), ctx)

    @torch.inference_mode()
    def run_with_taps(self, input_ids: torch.Tensor, slices: list[SeqSlice], tap_layer_ids
                      ) -> tuple[torch.Tensor, dict[int, torch.Tensor], StepContext]:
        """``run`` plus the model's features at ``tap_layer_ids`` ({layer: [T, D]}) and the step context.

        From a captured graph, the features and the context cover the padded batch (padding rows last,
        writing nothing); ``hidden`` is cut to the real rows."""
        if self.graphs is not None and self.graphs.supports(slices):
            out = self.graphs.run(input_ids, slices, tuple(tap_layer_ids))
            if out is not None:
                hidden, taps, ctx = out
                return hidden[:sum(s.num_tokens for s in slices)], taps, ctx
        ctx = self.context(slices)
        hidden, taps = self.model.forward_with_taps(input_ids.to(self.device), ctx, tap_layer_ids)
        return hidden, taps, ctx
