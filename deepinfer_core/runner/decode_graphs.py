"""Decode steps replayed from captured graphs: pad the step to a fixed shape, run it through the platform's
graph runner.

A captured graph replays fixed shapes, while a decode step has a varying number of requests and
context lengths. ``DecodeGraphs`` maps a pure-decode step (every request feeds one token) onto a
*bucket*:

- the batch is padded to the next captured batch size with dummy requests that feed position 0 of the
  null block with ``no_write_before = 1`` (they write no KV entry) and use a scratch state slot
  (``executor.scratch_state_slot``), so they touch nothing a real request reads;
- block tables are padded (null block) or cut to the width of a context bucket (the next power of two
  of the longest context, at least ``min_context``), and each compressed group reads that bucket's
  number of entries per token (-1 beyond a token's own visible entries, as in an eager step).

The step's input ids and all of its metadata travel in one packed int64 tensor (``context.pack_step``);
the function handed to the platform builds the ``StepContext`` from it on the device and runs the model
with ``ctx.extras["static_shapes"] = True`` (the models' capturable path: no host-side shortcuts). The
core never touches a graph API: ``wrap`` is the platform's ``graph_runner`` (CUDA graphs on NVIDIA),
which captures one graph per distinct (bucket) signature on first use and replays it afterwards.

Why dummy rows are harmless: every op of the model is per token or per request except the MoE's
routing load, and a padded row's outputs are dropped. In batch-invariant mode a real row's result is
bit-identical to the eager step's (tests/engine/test_decode_graphs.py checks this with an identity
``wrap`` on the CPU); in default mode GEMM tiling may differ with the padded batch size, as it may
with any other batch size.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import logging

import torch

from deepinfer_core.kv.spec import CompressedSpec, KVCacheSpec
from deepinfer_core.runner.context import (SeqSlice, StepLayout, TableRowCache, context_from_packed, pack_step,
                                           upload)

logger = logging.getLogger(__name__)

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


class DecodeGraphs:
    """Pad pure-decode steps to captured shapes and replay them.

    ``executor``: the ``PagedExecutor`` (model, group specs, caches, scratch state slot);
    ``wrap``: the platform's graph runner factory (``fn -> callable`` keyed by input signature);
    ``batch_sizes``: the batch buckets (sizes above ``executor.max_num_seqs`` are dropped);
    ``max_context``: the longest context a step may have (the engine's max_model_len);
    ``max_query_len``: the most tokens per request of a graphed step (1 + drafts under speculative decoding).
    """

    def __init__(self, executor: Any, wrap: Callable[[Callable[..., Any]], Callable[..., Any]],
                 batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES, max_context: int = 4096,
                 min_context: int = 256, max_query_len: int = 1) -> None:
        sizes = sorted({int(b) for b in batch_sizes if 0 < int(b) <= executor.max_num_seqs})
        if not sizes:
            raise ValueError(f"no graph batch size fits max_num_seqs={executor.max_num_seqs}: {list(batch_sizes)}")
        self.ex = executor
        self.batch_sizes = sizes
        self.max_context = _next_pow2(max(1, max_context))
        self.min_context = min(_next_pow2(max(1, min_context)), self.max_context)
        self.max_query_len = max_query_len
        self.graphed = wrap(self._step)
        self.steps = 0  # decode steps served from graphs (a metric)
        self.disabled_reason: str | None = None  # set when a capture failed: every later step runs eagerly
        self.strict = False  # re-raise a failed capture instead (diagnostics)
        self._wrap = wrap
        self._graphed_draft: Callable[..., Any] | None = None  # the proposer's block step, wrapped on first use
        self.proposer: Any = None  # set by the speculative DraftRunner: its greedy draft blocks are graphed too
        self.draft_steps = 0
        self.row_cache = TableRowCache()  # packed block-table rows reused while unchanged (host time per step)

    def supports(self, slices: list[SeqSlice]) -> bool:
        """A uniform decode step (every request feeds the same number of tokens, at most
        ``max_query_len``: 1, or 1 + drafts for a speculative verify step) whose batch and context fit a
        bucket (and graphs still work)."""
        if self.disabled_reason is not None or not 0 < len(slices) <= self.batch_sizes[-1]:
            return False
        q = slices[0].num_tokens
        return (q <= self.max_query_len and all(s.num_tokens == q for s in slices)
                and max(s.start_pos for s in slices) + q <= self.max_context)

    def bucket(self, slices: list[SeqSlice]) -> tuple[int, int]:
        """(padded batch size, context bucket) of a supported step. Context buckets step by a quarter of
        the power of two above them (256, 320, 384, 448, 512, 640, ...), so the padded reads cost at most
        ~25% more than the step's own while a long generation crosses few buckets (one graph each)."""
        b = next(n for n in self.batch_sizes if n >= len(slices))
        need = max(s.start_pos + s.num_tokens for s in slices)
        quarter = max(_next_pow2(need) // 4, 1)
        ctx = min(max(-(-need // quarter) * quarter, self.min_context), self.max_context)
        return b, ctx

    def run(self, input_ids: torch.Tensor, slices: list[SeqSlice], taps: tuple[int, ...] = (),
            ids_on_device: bool | None = None) -> Any:
        """input_ids [B*q] int64 (slice order) -> hidden [B*q, D] of the real requests; with ``taps``
        (layer ids) -> (hidden [B_pad*q, D], {layer: [B_pad*q, D]}, the padded StepContext), the padding
        rows last (the speculative proposer reads every row; the padding ones write nothing). None when
        the capture failed (graphs are then off for good and the caller runs the step eagerly).

        ``input_ids`` on the host are packed with the metadata. On the device (``ids_on_device``; by
        default: whenever they are not on the CPU) they are never read by the host: the metadata is
        packed with zero ids and the ids are copied into the uploaded tensor on the device, in stream
        order. That is how a step can take the previous step's sampled ids before they reach the host
        (the host packs step N+1 while the device still runs step N).

        The results are the graph's static outputs: valid until the next step runs."""
        q = slices[0].num_tokens
        b_pad, ctx_len = self.bucket(slices)
        if ids_on_device is None:
            ids_on_device = input_ids.device.type != "cpu"
        dev_ids = input_ids.reshape(-1) if ids_on_device else None
        ids = [0] * input_ids.numel() if ids_on_device else [int(t) for t in input_ids.tolist()]
        out = self._replay(self.graphed, slices, ids, b_pad, ctx_len, taps=tuple(taps), dev_ids=dev_ids)
        if out is None:
            return None
        self.steps += 1
        return out if taps else out[:len(slices) * q]

    def _replay(self, graphed: Callable[..., Any], slices: list[SeqSlice], ids: list[int], b_pad: int, ctx_len: int,
                dev_ids: torch.Tensor | None = None, **kw: Any) -> Any:
        """Pad ``slices`` (and their ``ids``) to ``b_pad`` requests with padding requests of the same
        length, pack everything at context bucket ``ctx_len`` and call ``graphed``. ``dev_ids``: the real
        requests' ids as a device tensor, written over the packed ids (the first ``len(ids)`` entries)
        after the upload. A failure (a capture that hit an op which synchronises) turns graphs off for
        good and returns None.

        Padding requests: position 0.., null-block tables, ``no_write_before`` = their length (no KV
        entry written) and the scratch state row."""
        host, layout = self.pack(slices, ids, b_pad, ctx_len)
        packed = upload(host, self.ex.device)
        if dev_ids is not None:
            packed[:dev_ids.numel()].copy_(dev_ids, non_blocking=True)
        try:
            return graphed(packed, layout=layout, **kw)
        except Exception as exc:  # noqa: BLE001 - a kernel that cannot be captured must not stop serving
            if self.strict:
                raise
            # The capture ran the step's eager warm-ups first, so the caches may hold this step's
            # writes already; they are the same values the eager step writes again.
            self.disabled_reason = f"{type(exc).__name__}: {exc}"
            logger.warning("decode graphs disabled, running eager steps: capture of batch %d x %d tokens / "
                           "context %d failed (%s)", b_pad, slices[0].num_tokens, ctx_len,
                           self.disabled_reason.splitlines()[0][:300])
            return None

    def pack(self, slices: list[SeqSlice], ids: list[int], b_pad: int, ctx_len: int) -> tuple[torch.Tensor, StepLayout]:
        """The host side of a graphed step: ``slices`` and ``ids`` padded to ``b_pad`` requests and packed
        at context bucket ``ctx_len`` -> (packed int64 host tensor, its layout)."""
        q = slices[0].num_tokens
        specs: dict[int, KVCacheSpec] = self.ex.group_specs
        pad = SeqSlice(0, q, {gid: [] for gid in specs}, state_slot=self.ex.scratch_state_slot, no_write_before=q)
        padded = list(slices) + [pad] * (b_pad - len(slices))
        ids = ids + [0] * (q * (b_pad - len(slices)))
        widths = {gid: -(-ctx_len // spec.block_size) for gid, spec in specs.items()}
        reads = {gid: ctx_len // spec.ratio for gid, spec in specs.items() if isinstance(spec, CompressedSpec)}
        return pack_step(padded, specs, ids, widths, reads, self.row_cache)

    def _step(self, packed: torch.Tensor, layout: StepLayout, taps: tuple[int, ...] = ()) -> Any:
        """The captured function: packed metadata [L] int64 (device) -> hidden [B_pad*q, D], or with
        ``taps`` (hidden, {layer: features}, ctx): the context's tensors are graph outputs too."""
        ids, ctx = context_from_packed(packed, layout, self.ex.group_specs, self.ex.cache_group, self.ex.caches, [],
                                       getattr(self.ex, "kernels", None))
        ctx.extras["static_shapes"] = True
        if not taps:
            return self.ex.model.forward(ids, ctx)
        hidden, features = self.ex.model.forward_with_taps(ids, ctx, list(taps))
        return hidden, features, ctx

    @torch.inference_mode()
    def warmup(self, query_lens: Sequence[int] = (1,), taps: tuple[int, ...] = (), draft_len: int = 0) -> int:
        """Capture every batch bucket at the smallest context bucket now (as vLLM does at start-up), so the
        first requests do not pay the captures and the graphs' memory is taken before serving. Each step
        holds padding requests only (they write nothing a request owns). ``query_lens``: tokens per request
        of the target steps (1, and 1 + N under speculative decoding, with the proposer's ``taps``);
        ``draft_len``: N, to capture the proposer's draft blocks too. Returns the number of signatures
        captured; a failed capture turns graphs off (as in ``run``) and ends the warm-up."""
        jobs = [(q, False) for q in query_lens] + ([(draft_len, True)] if draft_len and self.proposer else [])
        done = 0
        for b in self.batch_sizes:
            for q, draft in jobs:
                # one padding request as the "real" one: _replay adds b - 1 more
                one = [SeqSlice(0, q, {gid: [] for gid in self.ex.group_specs}, state_slot=self.ex.scratch_state_slot,
                                no_write_before=q)]
                if draft:
                    ok = self._replay(self._draft_graph(), one, [0] * q, b, self.min_context) is not None
                else:
                    ok = self._replay(self.graphed, one, [0] * q, b, self.min_context, taps=tuple(taps)) is not None
                if not ok:
                    return done
                done += 1
        return done

    # -- speculative proposer: one draft block of N positions per request --------------------------
    def supports_draft(self, slices: list[SeqSlice]) -> bool:
        return self.proposer is not None and self.supports(slices)

    def _draft_graph(self) -> Callable[..., Any]:
        if self._graphed_draft is None:
            self._graphed_draft = self._wrap(self._draft_step)
        return self._graphed_draft

    def run_draft(self, anchors: list[int], slices: list[SeqSlice]) -> Any:
        """Greedy draft blocks of the proposer: ``slices`` of N tokens at each request's P..P+N-1 and one
        anchor token id per request -> the proposer's ``DraftBatch`` over the padded batch (rows of the
        real requests first), or None when the capture failed (then graphs are off, as for ``run``)."""
        n = slices[0].num_tokens
        b_pad, ctx_len = self.bucket(slices)
        ids = [t for a in anchors for t in [int(a)] + [0] * (n - 1)]
        out = self._replay(self._draft_graph(), slices, ids, b_pad, ctx_len)
        if out is not None:
            self.draft_steps += 1
        return out

    def _draft_step(self, packed: torch.Tensor, layout: StepLayout) -> Any:
        """Captured: packed draft-block metadata (ids hold each request's anchor, then N-1 fillers) ->
        the proposer's greedy DraftBatch [B_pad, N]."""
        ids, ctx = context_from_packed(packed, layout, self.ex.group_specs, self.ex.cache_group, self.ex.caches, [],
                                       getattr(self.ex, "kernels", None))
        ctx.extras["static_shapes"] = True
        b = layout.num_seqs
        anchors = ids.view(b, -1)[:, 0]
        return self.proposer.propose(anchors, ctx, [None] * b, [1.0] * b)
