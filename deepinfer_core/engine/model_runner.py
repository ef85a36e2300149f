"""ModelRunner: SchedulerOutput -> step inputs -> model -> logits -> sampled tokens.

Runs on the engine's worker (a thread in async mode); steps execute strictly in
order. The runner keeps, per request, the token history it has sampled itself,
so a step planned before the previous step's tokens reached the scheduler (async
scheduling) still gets the right placeholder ids and penalty history.

A step is ``launch``ed, then ``finish``ed (``execute`` does both). A *simple* step (no drafts, no
grammar, no penalties, no prompt logprobs, no pending min_tokens: its sampling needs nothing from the
host's token history) leaves its sampled tokens on the device at launch, and the next simple step can be
launched behind it before they reach the host (``launch(next, prev=launched)``): its decode ids are
copied from the previous step's token tensor on the device. The host then packs step N+1 while the
device still runs step N, as vLLM's asynchronous scheduling does. Tokens, positions and random streams
are the same as with the steps run one after the other (tests/engine/test_chained_steps.py).
"""
from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from deepinfer_core.request import PLACEHOLDER_TOKEN_ID
from deepinfer_core.runner.context import SeqSlice, upload
from deepinfer_core.runner.executor import PagedExecutor
from deepinfer_core.runner.sampler import (LogprobsTensors, Sampler, SamplingMetadata, TokenLogprobs, compute_logprobs, gather_logprobs,
                                           position_seed)
from deepinfer_core.sampling_params import SamplingParams
from deepinfer_core.sched_output import ScheduledRequest, SchedulerOutput
from deepinfer_core.spec_decode.confidence import ConfidenceScheduler
from deepinfer_core.spec_decode.draft_runner import DraftRequest, DraftRunner
from deepinfer_core.spec_decode.verify import accept_uniform, verify_greedy, verify_sampled
from deepinfer_core.structured.xgrammar_backend import allowed_prefix


@dataclass
class RunnerRequest:
    """What the runner remembers of a sequence (CPU)."""

    params: SamplingParams
    prompt_token_ids: list[int]
    generator: torch.Generator
    output_token_ids: list[int] = field(default_factory=list)
    matcher: Any = None  # xgrammar GrammarMatcher for structured outputs, advanced on this worker
    seed: int = 0  # the request's seed (or one derived from the engine seed) ...
    seq_index: int = 0  # ... and which of its n sequences this is: the random stream is keyed by position
    draft_probs: Any = None  # speculative: [N, V] distributions of the pending drafts (probabilistic drafting)
    pending_drafts: list[int] = field(default_factory=list)  # speculative: drafts for the positions after the last token
    pending_conf: list[float] | None = None  # ... and the proposer's confidence in each


@dataclass
class _SampleGroup:
    """A sampling request's rows in this step: ``row`` = the anchor's row, then one per draft."""

    s: ScheduledRequest
    rr: RunnerRequest
    row: int
    drafts: list[int]
    anchor_pos: int  # the anchor's position
    emitted: list[int] = field(default_factory=list)


@dataclass
class PromptLogprob:
    """Logprob of prompt token at ``position`` (predicted from the positions before it)."""

    position: int
    token_id: int
    logprob: float
    rank: int
    top_token_ids: list[int]
    top_logprobs: list[float]


@dataclass
class StepResult:
    """One step's results (CPU): emitted tokens per sampling request (1, or up to 1 + drafts under
    speculative decoding), their logprobs, the next drafts per request (speculative decoding)."""

    sampled: dict[str, list[int]] = field(default_factory=dict)
    logprobs: dict[str, list[TokenLogprobs]] = field(default_factory=dict)
    prompt_logprobs: dict[str, list[PromptLogprob]] = field(default_factory=dict)
    grammar_terminated: set[str] = field(default_factory=set)  # grammar complete after this token
    grammar_errors: dict[str, str] = field(default_factory=dict)  # token rejected by the grammar
    drafts: dict[str, tuple[list[int], list[float] | None]] = field(default_factory=dict)  # next drafts
    spec_counts: dict[str, tuple[int, int]] = field(default_factory=dict)  # draft steps: (proposed, verified)


@dataclass
class LaunchedStep:
    """A launched step. ``result`` is set when the step already finished at launch (a step that needs the
    host while sampling); otherwise ``tokens`` (int64 [G] on the device) holds one sampled token per
    sampling group, ``logprobs`` the gathered logprobs of the groups that asked for them (rows
    ``logprob_rows`` of ``tokens``, or None), and ``finish`` brings both to the host.
    ``row_of``: request id -> its index in ``tokens``, for a next step launched before that."""

    so: SchedulerOutput
    result: StepResult | None = None
    groups: list["_SampleGroup"] = field(default_factory=list)
    tokens: torch.Tensor | None = None
    logprobs: LogprobsTensors | None = None
    logprob_rows: list[int] = field(default_factory=list)
    row_of: dict[str, int] = field(default_factory=dict)
    # on an accelerator: ``tokens`` and ``logprobs`` copied to pinned host memory asynchronously, and the
    # event recorded after those copies; ``finish`` waits for the event only. (``tolist()`` on a device
    # tensor would synchronise the whole stream, i.e. also wait for the step chained behind this one.)
    tokens_host: torch.Tensor | None = None
    ready: Any = None


class ModelRunner:
    def __init__(self, model, executor: PagedExecutor, sampler: Sampler, eos_token_ids: tuple[int, ...],
                 apply_bitmask: Callable | None = None, grammar=None, drafter: DraftRunner | None = None,
                 confidence: ConfidenceScheduler | None = None):
        """``apply_bitmask``: the resolved ``structured.apply_bitmask`` op; ``grammar``: a GrammarBackend
        (None until the first structured request); ``drafter``: speculative decoding's proposer side;
        ``confidence``: confidence-scheduled verification (None: verify every scheduled draft)."""
        self.drafter = drafter
        self.confidence = confidence
        self.apply_bitmask = apply_bitmask
        self.grammar = grammar
        self.model = model
        self.executor = executor
        self.sampler = sampler
        self.eos_token_ids = eos_token_ids
        self.requests: dict[str, RunnerRequest] = {}
        self.chained_steps = 0  # steps launched behind a step whose tokens had not reached the host (a metric)

    def add_request(self, req_id: str, params: SamplingParams, prompt_token_ids: list[int], generator: torch.Generator,
                    output_token_ids: list[int] | None = None, matcher: Any = None, seed: int = 0,
                    seq_index: int = 0) -> None:
        self.requests[req_id] = RunnerRequest(params, list(prompt_token_ids), generator, list(output_token_ids or []),
                                              matcher, seed, seq_index)

    def rollback(self, req_id: str, num_tokens: int) -> None:
        """Forget the last ``num_tokens`` sampled tokens (rejected speculative tokens): history and grammar."""
        rr = self.requests[req_id]
        if num_tokens:
            del rr.output_token_ids[-num_tokens:]
            if rr.matcher is not None:
                rr.matcher.rollback(num_tokens)

    def drop(self, req_id: str) -> None:
        self.requests.pop(req_id, None)

    def execute(self, so: SchedulerOutput) -> StepResult:
        """Run one step to the end: ``finish(launch(so))``."""
        return self.finish(self.launch(so))

    def is_simple(self, so: SchedulerOutput) -> bool:
        """Whether every request of ``so`` samples without the host: no drafts (speculative decoding off),
        no grammar, no penalties, no prompt logprobs, no min_tokens still to reach."""
        if self.drafter is not None:
            return False
        for s in so.scheduled:
            rr = self.requests.get(s.req_id)
            if rr is None or s.num_draft_tokens or rr.pending_drafts or rr.matcher is not None:
                return False
            p = rr.params
            if p.has_penalties or p.prompt_logprobs is not None or p.min_tokens > len(rr.output_token_ids):
                return False
        return True

    def can_chain(self, so: SchedulerOutput) -> bool:
        """Whether ``so`` may be launched before the previous step's tokens reach the host."""
        return not so.is_empty and self.is_simple(so)

    @torch.inference_mode()
    def launch(self, so: SchedulerOutput, prev: LaunchedStep | None = None,
               simple: bool | None = None) -> LaunchedStep:
        """Queue step ``so`` on the device. ``prev``: the step before it when that one is not finished yet
        (``can_chain(so)`` must hold): the decode ids of its sampled requests come from ``prev.tokens`` on
        the device and their positions are one further than the host's history says. ``simple``: the
        caller's ``is_simple(so)`` when it already has it (the engine asked ``can_chain``; O(batch) saved)."""
        for rid in so.finished_req_ids:
            self.drop(rid)
        if so.is_empty:
            return LaunchedStep(so, result=StepResult())
        if (self.is_simple(so) if simple is None else simple):
            return self._launch_simple(so, prev)
        if prev is not None and prev.result is None:
            raise RuntimeError("a step that samples on the host cannot be launched before the previous one finished")
        return LaunchedStep(so, result=self._execute_full(so))

    def finish(self, launched: LaunchedStep) -> StepResult:
        """The host side of a launched step: its tokens (one wait for the device), the runner's history,
        logprobs. Requests dropped since the launch still get their token (the engine discards it)."""
        if launched.result is not None:
            return launched.result
        result = StepResult()
        if launched.ready is not None:
            launched.ready.synchronize()
        host = launched.tokens_host if launched.tokens_host is not None else launched.tokens
        tokens = host.tolist() if host is not None else []
        for g, t in zip(launched.groups, tokens):
            g.rr.output_token_ids.append(t)
            result.sampled[g.s.req_id] = [t]
        if launched.logprobs is not None:  # host tensors by now (pinned copies on an accelerator)
            for i, row in zip(launched.logprob_rows, launched.logprobs.rows()):
                result.logprobs[launched.groups[i].s.req_id] = [row]
        launched.result = result
        return result

    def _launch_simple(self, so: SchedulerOutput, prev: LaunchedStep | None) -> LaunchedStep:
        """Inputs, model and sampling of a simple step, all queued on the device (no wait for it)."""
        lagging = prev.row_of if prev is not None and prev.result is None else {}
        slices: list[SeqSlice] = []
        ids: list[int] = []
        feed_at: list[int] = []  # rows whose id is the previous step's token, still on the device ...
        feed_from: list[int] = []  # ... at this index of prev.tokens
        groups: list[_SampleGroup] = []
        for s in so.scheduled:
            rr = self.requests[s.req_id]
            toks, start = s.token_ids, s.num_computed_tokens
            if toks and toks[-1] == PLACEHOLDER_TOKEN_ID:  # a decode: the anchor is the last sampled token
                start, anchor = self._decode_anchor(rr)
                if s.req_id in lagging:  # ... which is still on the device: one position further
                    start += 1
                    feed_at.append(len(ids))
                    feed_from.append(lagging[s.req_id])
                    toks = [0]
                else:
                    toks = [anchor]
            if s.samples:
                groups.append(_SampleGroup(s, rr, len(ids) + len(toks) - 1, [], start + len(toks) - 1))
            ids.extend(toks)
            slices.append(SeqSlice(start, len(toks), s.block_tables, s.state_slot, s.cached_until, s.window_floor,
                                   False))
        dev = self.executor.device
        input_ids = torch.tensor(ids, dtype=torch.long)
        if feed_at:
            input_ids = upload(input_ids, dev).index_copy_(
                0, upload(torch.tensor(feed_at), dev), prev.tokens[upload(torch.tensor(feed_from), dev)])
            self.chained_steps += 1
        hidden = self.executor.run(input_ids, slices)
        launched = LaunchedStep(so, groups=groups, row_of={g.s.req_id: i for i, g in enumerate(groups)})
        if groups:
            self._sample_on_device(hidden, launched)
        return launched

    @staticmethod
    def _decode_anchor(rr: RunnerRequest) -> tuple[int, int | None]:
        """(position, id) of a decoding request's anchor as the host knows it: its last emitted token, at the
        position after its prompt and earlier outputs. Both step paths feed it; a chained step feeds the token
        one further, still on the device (the id is None while the host has no output of the request yet)."""
        out = rr.output_token_ids
        return len(rr.prompt_token_ids) + len(out) - 1, out[-1] if out else None

    def _sample_on_device(self, hidden: torch.Tensor, launched: LaunchedStep) -> None:
        """One token per group of a simple step, left on the device (``launched.tokens``): greedy rows take
        the argmax, the others one draw from their (seed, sequence, position) stream, as ``_sample`` does."""
        groups = launched.groups
        logits = self.model.compute_logits(hidden[upload(torch.tensor([g.row for g in groups]), hidden.device)])
        meta = SamplingMetadata(params=[g.rr.params for g in groups],
                                output_token_ids=[g.rr.output_token_ids for g in groups],
                                prompt_token_ids=[g.rr.prompt_token_ids for g in groups],
                                generators=[g.rr.generator for g in groups], eos_token_ids=self.eos_token_ids)
        x, raw = self.sampler.process(logits, meta)
        tokens = x.argmax(dim=-1)
        plain = [i for i, g in enumerate(groups) if not g.rr.params.greedy]
        if plain:
            for i in plain:
                g = groups[i]
                g.rr.generator.manual_seed(position_seed(g.rr.seed, g.rr.seq_index, g.anchor_pos + 1))
            idx = upload(torch.tensor(plain), x.device)
            tokens[idx] = self.sampler.draw(x[idx], [groups[i].rr.generator for i in plain])
        launched.tokens = tokens
        want = [i for i, g in enumerate(groups) if g.rr.params.logprobs is not None]
        if raw is not None and want:
            # gathered here, on the device, so that ``finish`` only reads host memory (no stream-wide sync)
            sel = upload(torch.tensor(want), raw.device) if len(want) < len(groups) else None
            rows_raw, rows_tok = (raw, tokens) if sel is None else (raw[sel], tokens[sel])
            ks = [_num_logprobs(groups[i].rr.params, raw.shape[-1]) for i in want]
            launched.logprobs = LogprobsTensors(*gather_logprobs(rows_raw, rows_tok, max(ks)), ks)
            launched.logprob_rows = want
        if _needs_host_copy(tokens):
            launched.tokens_host = _to_pinned(tokens)
            if launched.logprobs is not None:
                lp = launched.logprobs
                launched.logprobs = LogprobsTensors(_to_pinned(lp.token_ids), _to_pinned(lp.logprobs),
                                                    _to_pinned(lp.ranks), lp.num_logprobs)
            launched.ready = _recorded_event(tokens.device)

    def _execute_full(self, so: SchedulerOutput) -> StepResult:
        """A step whose sampling needs the host (drafts, grammar, penalties, prompt logprobs ...)."""
        result = StepResult()
        slices: list[SeqSlice] = []
        ids: list[int] = []
        feeds: list[tuple[int, int]] = []  # per entry: (start position, drafts fed)
        verify = self._verify_counts(so)
        for s in so.scheduled:
            toks, start, fed_drafts = s.token_ids, s.num_computed_tokens, 0
            if s.num_draft_tokens or (toks and toks[-1] == PLACEHOLDER_TOKEN_ID):
                # A decode continuing this runner's own state: the anchor is the last token it
                # emitted, at the position after its history (the scheduler's count is optimistic
                # while a speculative step is in flight), and the drafts are the ones it proposed.
                rr = self.requests[s.req_id]
                start, anchor = self._decode_anchor(rr)
                drafts = rr.pending_drafts[:verify.get(s.req_id, s.num_draft_tokens)]
                fed_drafts = len(drafts)
                if s.num_draft_tokens or rr.pending_drafts:
                    result.spec_counts[s.req_id] = (len(rr.pending_drafts), fed_drafts)
                rr.pending_drafts = []
                toks = [anchor] + drafts
            ids.extend(toks)
            feeds.append((start, fed_drafts))
            slices.append(SeqSlice(start, len(toks), s.block_tables, s.state_slot, s.cached_until, s.window_floor,
                                   self.requests[s.req_id].params.prompt_logprobs is not None))
        fills = self._pad_to_uniform(so, slices, ids)
        input_ids = torch.tensor(ids, dtype=torch.long)
        if self.drafter is not None:
            hidden, taps, ctx = self.executor.run_with_taps(input_ids, slices, self.drafter.proposer.tap_layer_ids)
            self.drafter.observe(taps, ctx)
        else:
            hidden = self.executor.run(input_ids, slices)

        # rows to turn into logits: the last 1 + drafts rows of every sampling request, and
        # prompt rows whose request asked for prompt logprobs.
        groups: list[_SampleGroup] = []
        prompt_rows = []
        row = 0
        for s, sl, (start, L), fill in zip(so.scheduled, slices, feeds, fills):
            rr = self.requests[s.req_id]
            fed = sl.num_tokens - fill  # the filler rows after a slice's tokens are never read
            if rr.params.prompt_logprobs is not None:
                n_prompt = len(rr.prompt_token_ids)
                for j in range(fed):
                    p = start + j
                    if p + 1 < n_prompt:
                        prompt_rows.append((s.req_id, row + j, p + 1))
            if s.samples:
                anchor = row + fed - 1 - L
                groups.append(_SampleGroup(s, rr, anchor, ids[anchor + 1:anchor + 1 + L], start + fed - 1 - L))
            row += sl.num_tokens
        if groups:
            self._sample(hidden, groups, result)
            if self.drafter is not None:
                self._propose(groups, result)
        if prompt_rows:
            self._prompt_logprobs(hidden, prompt_rows, result)
        return result

    def _pad_to_uniform(self, so: SchedulerOutput, slices: list[SeqSlice], ids: list[int]) -> list[int]:
        """Speculative steps under captured graphs: give every request the same number of rows, so the
        step replays a graph even when requests verify different numbers of drafts (confidence trimming,
        a request's first decode after its prompt, drafts a grammar cut). A shorter slice gets filler rows
        (its last token repeated) at the positions after its own; they are treated like rejected drafts:
        nothing reads them, the blocks for them exist (the scheduler reserves N positions past every
        sampling chunk) and the step that really feeds those positions rewrites their KV and state.
        Edits ``slices`` and ``ids`` in place; returns the filler count per slice."""
        fills = [0] * len(slices)
        graphs = getattr(self.executor, "graphs", None)
        if self.drafter is None or graphs is None or not slices:
            return fills
        q = max(sl.num_tokens for sl in slices)
        if q == min(sl.num_tokens for sl in slices) or q > graphs.max_query_len:
            return fills
        if not all(s.samples and q - sl.num_tokens <= self.drafter.n and not sl.keep_all_rows
                   for s, sl in zip(so.scheduled, slices)):
            return fills
        padded = [dataclasses.replace(sl, num_tokens=q) for sl in slices]
        if not graphs.supports(padded):
            return fills
        out, row = [], 0
        for i, sl in enumerate(slices):
            seg = ids[row:row + sl.num_tokens]
            row += sl.num_tokens
            fills[i] = q - sl.num_tokens
            out += seg + [seg[-1]] * fills[i]
        ids[:] = out
        slices[:] = padded
        return fills

    def _verify_counts(self, so: SchedulerOutput) -> dict[str, int]:
        """Confidence-scheduled verification: how many of its scheduled drafts each request verifies,
        planned here with the proposer's fresh confidences (the scheduler reserved room for all)."""
        if self.confidence is None:
            return {}
        conf, order, base = {}, [], 0
        for s in so.scheduled:
            base += s.num_scheduled_tokens - s.num_draft_tokens
            if s.num_draft_tokens:
                rr = self.requests[s.req_id]
                c = rr.pending_conf if rr.pending_conf is not None else [1.0] * len(rr.pending_drafts)
                conf[s.req_id] = c[:min(s.num_draft_tokens, len(rr.pending_drafts))]
                order.append(s.req_id)
        return self.confidence.plan(conf, order, base) if order else {}

    def _sample(self, hidden: torch.Tensor, groups: list["_SampleGroup"], result: StepResult) -> None:
        """Sample (and verify drafts of) every sampling request; fills result.sampled/logprobs/grammar."""
        # A terminated matcher belongs to a request that finished in the step before this one
        # (async scheduling planned this step first): its output here is discarded anyway.
        constrained = [g for g in groups if g.rr.matcher is not None and not g.rr.matcher.is_terminated()]
        bitmask = None
        if constrained:  # requests without constraints pay nothing
            first, rows = {}, 0
            for g in groups:
                first[id(g)] = rows
                rows += 1 + len(g.drafts)
            bitmask, valid = self.grammar.fill_bitmask_drafts(
                [(g.rr.matcher, first[id(g)], g.drafts) for g in constrained], rows)
            for g, ok in zip(constrained, valid):
                g.drafts = g.drafts[:ok]  # drafts the grammar forbids cannot be accepted: not verified
            keep = [first[id(g)] + i for g in groups for i in range(1 + len(g.drafts))]
            bitmask = bitmask[keep]
        rows = [g.row + i for g in groups for i in range(1 + len(g.drafts))]
        logits = self.model.compute_logits(hidden[rows])
        if bitmask is not None:
            logits = self.apply_bitmask(logits, bitmask)
        vp, vout, vprompt, vgen = [], [], [], []  # one virtual row per (request, draft prefix)
        for g in groups:
            for i in range(1 + len(g.drafts)):
                vp.append(g.rr.params)
                vgen.append(g.rr.generator)  # (process() draws nothing; draws reseed it per position)
                vout.append(g.rr.output_token_ids + g.drafts[:i] if i else g.rr.output_token_ids)
                vprompt.append(g.rr.prompt_token_ids)
        meta = SamplingMetadata(params=vp, output_token_ids=vout, prompt_token_ids=vprompt,
                                generators=vgen, eos_token_ids=self.eos_token_ids)
        x, raw = self.sampler.process(logits, meta)
        greedy_rows = torch.tensor([i for i, p in enumerate(vp) if p.greedy], dtype=torch.long, device=x.device)
        argmax = dict(zip(greedy_rows.tolist(), x[greedy_rows].argmax(dim=-1).tolist())) if len(greedy_rows) else {}
        firsts = list(itertools.accumulate((1 + len(g.drafts) for g in groups), initial=0))
        # Plain sampling (no drafts): one batched draw, each row from its own (seed, sequence, position) stream.
        plain = [(v, g.rr) for v, g in zip(firsts, groups) if not g.drafts and not g.rr.params.greedy]
        drawn = {}
        if plain:
            for _, rr in plain:
                rr.generator.manual_seed(position_seed(rr.seed, rr.seq_index,
                                                       len(rr.prompt_token_ids) + len(rr.output_token_ids)))
            idx = torch.tensor([v for v, _ in plain], dtype=torch.long, device=x.device)
            drawn = dict(zip((v for v, _ in plain), self.sampler.draw(x[idx], [rr.generator for _, rr in plain]).tolist()))
        for v0, g in zip(firsts, groups):
            rr, L = g.rr, len(g.drafts)
            pos0 = len(rr.prompt_token_ids) + len(rr.output_token_ids)  # index of the first emitted token
            if rr.params.greedy:
                emitted = verify_greedy([argmax[v0 + i] for i in range(L + 1)], g.drafts)
            elif v0 in drawn:
                emitted = [drawn[v0]]
            else:
                coins = [accept_uniform(rr.seed, rr.seq_index, pos0 + i) for i in range(L)]
                q = rr.draft_probs[:L] if (L and rr.draft_probs is not None) else None
                emitted = verify_sampled(x[v0:v0 + L + 1], g.drafts, q,
                                         coins, lambda lg, i, rr=rr, p0=pos0: self._draw(rr, lg, p0 + i))
            rr.draft_probs = None
            emitted = self._advance_grammar(g.s.req_id, rr, emitted, result)
            rr.output_token_ids.extend(emitted)
            result.sampled[g.s.req_id] = emitted
            g.emitted = emitted
            if raw is not None and rr.params.logprobs is not None:
                result.logprobs[g.s.req_id] = self._token_logprobs(raw[v0:v0 + len(emitted)], emitted, rr.params)

    def _draw(self, rr: RunnerRequest, logits: torch.Tensor, position: int) -> int:
        """Draw the token at ``position`` from softmax(logits [V]) with the (seed, sequence, position) stream."""
        rr.generator.manual_seed(position_seed(rr.seed, rr.seq_index, position))
        return int(self.sampler.draw(logits[None], [rr.generator])[0])

    def _advance_grammar(self, rid: str, rr: RunnerRequest, emitted: list[int], result: StepResult) -> list[int]:
        """Accept emitted tokens into the request's matcher; a completed grammar cuts the list there."""
        m = rr.matcher
        if m is None or m.is_terminated():
            return emitted
        for j, t in enumerate(emitted):
            if not m.accept_token(t):
                result.grammar_errors[rid] = f"token {t} was rejected by the request's grammar"
                return emitted[:j + 1]
            if m.is_terminated():
                result.grammar_terminated.add(rid)
                return emitted[:j + 1]
        return emitted

    @staticmethod
    def _token_logprobs(raw: torch.Tensor, tokens: list[int], params: SamplingParams) -> list[TokenLogprobs]:
        """raw [n, V] logprobs of the rows that emitted ``tokens`` (one each) -> their TokenLogprobs."""
        k = _num_logprobs(params, raw.shape[-1])
        ids, lps, ranks = gather_logprobs(raw, torch.tensor(tokens, dtype=torch.long, device=raw.device), k)
        return LogprobsTensors(ids, lps, ranks, [k] * len(tokens)).rows()

    def _propose(self, groups: list["_SampleGroup"], result: StepResult) -> None:
        """Next drafts for every request that sampled (grammar-checked, so every draft is allowed)."""
        reqs = []
        for g in groups:
            rr, s = g.rr, g.s
            if s.req_id in result.grammar_terminated or s.req_id in result.grammar_errors:
                continue
            reqs.append(DraftRequest(s.req_id, g.emitted[-1], g.anchor_pos + len(g.emitted), s.block_tables, s.state_slot,
                                     self.drafter.draft_seed(rr.params, rr.seed, rr.seq_index),
                                     rr.params.temperature if not rr.params.greedy else 1.0))
        for rid, (tokens, conf, probs) in self.drafter.propose(reqs).items():
            rr = self.requests[rid]
            if rr.matcher is not None and not rr.matcher.is_terminated():
                tokens = tokens[:allowed_prefix(rr.matcher, tokens)]  # a forbidden draft cannot be accepted
            rr.draft_probs = probs
            rr.pending_drafts = list(tokens)
            rr.pending_conf = None if conf is None else conf[:len(tokens)]
            result.drafts[rid] = (tokens, None if conf is None else conf[:len(tokens)])

    def _prompt_logprobs(self, hidden: torch.Tensor, rows: list[tuple[str, int, int]], result: StepResult) -> None:
        logits = self.model.compute_logits(hidden[[r for _, r, _ in rows]])
        lps = compute_logprobs(logits)
        targets = torch.tensor([self.requests[rid].prompt_token_ids[p] for rid, _, p in rows], dtype=torch.long)
        ks = [max(0, self.requests[rid].params.prompt_logprobs) if self.requests[rid].params.prompt_logprobs != -1
              else logits.shape[1] for rid, _, _ in rows]
        k = max(ks)
        tids, tlps, ranks = gather_logprobs(lps, targets.to(lps.device), k)
        tids, tlps, ranks = tids.tolist(), tlps.tolist(), ranks.tolist()
        for i, (rid, _, p) in enumerate(rows):
            kk = ks[i]
            result.prompt_logprobs.setdefault(rid, []).append(
                PromptLogprob(p, tids[i][0], tlps[i][0], int(ranks[i]), tids[i][1:1 + kk], tlps[i][1:1 + kk]))


def _num_logprobs(params: SamplingParams, vocab: int) -> int:
    """How many top logprobs ``params`` asks for, over a vocabulary of ``vocab`` (-1: all of them)."""
    return vocab if params.logprobs == -1 else min(params.logprobs, vocab)


def _needs_host_copy(t: torch.Tensor) -> bool:
    """Whether ``t`` lives on an accelerator, so ``finish`` reads an asynchronous host copy of it."""
    return t.device.type != "cpu"


def _recorded_event(device: torch.device) -> Any:
    """An event recorded on ``device``'s current stream (after the copies queued so far)."""
    event = torch.Event(device=device)
    event.record()
    return event


def _to_pinned(t: torch.Tensor) -> torch.Tensor:
    """An asynchronous copy of device tensor ``t`` into pinned host memory (read it after an event)."""
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host
