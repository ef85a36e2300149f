"""A minimal driver over ``PagedExecutor``: fresh blocks per request, no scheduler.

Used to prove incremental decoding (prefill in chunks, then one token at a time,
several requests in one step) before the engine's scheduler exists, and by tests.
"""
from __future__ import annotations

import torch

from deepinfer_core.kv.spec import CompressedSpec, SlidingWindowSpec
from deepinfer_core.runner.context import SeqSlice
from deepinfer_core.runner.executor import PagedExecutor


class SimpleBlockAllocator:
    """Hands out increasing block ids per (request, group); never frees (tests only)."""

    def __init__(self, executor: PagedExecutor):
        self.ex = executor
        self.next_block = 1  # id 0 left unused so stale reads would show up
        self.tables: dict[tuple[int, int], list[int]] = {}

    def tables_for(self, rid: int, upto_tokens: int) -> dict[int, list[int]]:
        out = {}
        for gid, spec in self.ex.group_specs.items():
            assert isinstance(spec, (SlidingWindowSpec, CompressedSpec))
            table = self.tables.setdefault((rid, gid), [])
            need = -(-upto_tokens // spec.block_size)
            while len(table) < need:
                if self.next_block >= self.ex.num_blocks:
                    raise RuntimeError("SimpleBlockAllocator ran out of blocks")
                table.append(self.next_block)
                self.next_block += 1
            out[gid] = list(table)
        return out


def run_requests(executor: PagedExecutor, requests: list[list[int]], schedule: list[list[tuple[int, int]]]) -> dict[int, torch.Tensor]:
    """Run steps; ``schedule[step] = [(request index, num tokens), ...]`` fed in order.

    Returns request index -> hidden states of all its positions [L, D] (concatenated over steps).
    """
    alloc = SimpleBlockAllocator(executor)
    done = {i: 0 for i in range(len(requests))}
    hidden: dict[int, list[torch.Tensor]] = {i: [] for i in range(len(requests))}
    for step in schedule:
        slices, ids = [], []
        for rid, n in step:
            s0 = done[rid]
            slices.append(SeqSlice(s0, n, alloc.tables_for(rid, s0 + n), state_slot=rid))
            ids.extend(requests[rid][s0:s0 + n])
        out = executor.run(torch.tensor(ids, dtype=torch.long), slices)
        row = 0
        for rid, n in step:
            hidden[rid].append(out[row:row + n])
            row += n
            done[rid] += n
    return {i: torch.cat(h) for i, h in hidden.items() if h}
