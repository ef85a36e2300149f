"""HostKVStore: the host-memory tensors of the prefix cache's second tier, and the copies.

The KV manager decides what moves (``deepinfer_core.kv.host_tier.HostTier`` records an
ordered list of ``HostCopy``); this class, which lives next to the ``PagedExecutor``, moves
the data. ``apply`` must run on the thread that runs model steps, after every earlier step
and before the step the copies were planned with (the invariant is in ``host_tier.py``);
the engine does that in ``LLMEngine._execute``.

Layout. The executor keeps one flat cache per cache layer, ``[num_blocks * E, *entry_shape]``
(``E`` = entries per block of the layer's group, dtype = the group spec's dtype); block id
``b`` owns rows ``[b*E, (b+1)*E)`` in every layer of its group. A host entry ``(group, hash)``
is one tensor ``[L, E, *entry_shape]`` of the same dtype on the host, ``L`` = the group's
cache layers in ``executor.group_members[group]`` order (a draft model's caches that share a
group with the target's are members too, so they travel with the block). Its size is
``spec.page_bytes * L``, the figure ``HostTier`` budgets with.

Copies are batched: consecutive ops of the same kind and group become one gather per layer
and one device-host transfer for the run (a run never repeats a block id, so a restore run
never writes one row twice). Host memory is ordinary pageable memory (pinned staging buffers
and copies overlapped with compute are not done).
"""
from __future__ import annotations

import time

import torch

from deepinfer_core.kv.host_tier import DROP, RESTORE, SPILL, HostCopy


class HostKVStore:
    """``(group, hash) -> [L, E, *entry_shape]`` host tensors for one ``PagedExecutor``'s caches."""

    def __init__(self, executor) -> None:
        self.executor = executor
        self.entries: dict[tuple[int, int], torch.Tensor] = {}
        self.bytes_used = 0
        self.seconds = 0.0  # wall time spent in apply (metrics; copies are synchronous)

    def block_bytes(self) -> dict[int, int]:
        """Host bytes of one spilled block per group: ``page_bytes * cache layers in the group``."""
        ex = self.executor
        return {g: ex.group_specs[g].page_bytes * len(ex.group_members[g]) for g in ex.group_specs}

    @torch.no_grad()
    def apply(self, ops: list[HostCopy]) -> None:
        """Replay the manager's copies in order (spill: device -> new host entry; restore: host -> device; drop)."""
        t0 = time.perf_counter()
        i = 0
        while i < len(ops):
            j, blocks = i, set()
            while (j < len(ops) and ops[j].kind == ops[i].kind and ops[j].group == ops[i].group
                   and ops[j].block_id not in blocks):
                blocks.add(ops[j].block_id)
                j += 1
            run = ops[i:j]
            if run[0].kind == SPILL:
                self._spill(run)
            elif run[0].kind == RESTORE:
                self._restore(run)
            elif run[0].kind == DROP:
                for op in run:
                    t = self.entries.pop((op.group, op.key))
                    self.bytes_used -= t.numel() * t.element_size()
            else:
                raise ValueError(f"unknown host copy kind {run[0].kind!r}")
            i = j
        self.seconds += time.perf_counter() - t0

    def _rows(self, group: int, block_ids: list[int]) -> torch.Tensor:
        """Flat cache rows of ``block_ids`` in group order: [n * E] int64 on the executor's device."""
        e = self.executor.group_specs[group].entries_per_block
        ids = torch.tensor(block_ids, dtype=torch.long)
        rows = (ids[:, None] * e + torch.arange(e)[None, :]).reshape(-1)
        return rows.to(self.executor.device)

    def _spill(self, run: list[HostCopy]) -> None:
        ex, g = self.executor, run[0].group
        rows = self._rows(g, [op.block_id for op in run])
        n, e = len(run), ex.group_specs[g].entries_per_block
        # [L, n*E, *entry] gathered on the device, then one transfer to the host
        data = torch.stack([ex.caches[name].index_select(0, rows) for name in ex.group_members[g]]).cpu()
        data = data.view(data.shape[0], n, e, *data.shape[2:])
        for k, op in enumerate(run):
            key = (g, op.key)
            if key in self.entries:
                raise ValueError(f"host entry {key} spilled twice (the manager keeps one copy per hash)")
            t = data[:, k].clone()  # its own storage, so dropping one entry frees its bytes
            self.entries[key] = t
            self.bytes_used += t.numel() * t.element_size()

    def _restore(self, run: list[HostCopy]) -> None:
        ex, g = self.executor, run[0].group
        rows = self._rows(g, [op.block_id for op in run])
        data = torch.stack([self.entries[(g, op.key)] for op in run], dim=1)  # [L, n, E, *entry]
        data = data.to(ex.device).flatten(1, 2)  # [L, n*E, *entry]
        for layer, name in enumerate(ex.group_members[g]):
            ex.caches[name].index_copy_(0, rows, data[layer])
