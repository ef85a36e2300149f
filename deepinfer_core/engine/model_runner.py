"""ModelRunner: SchedulerOutput -> step inputs -> model -> logits -> sampled tokens.

Runs on the engine's worker (a thread in async mode); steps execute strictly in
order. The runner keeps, per request, the token history it has sampled itself,
so a step planned before the previous step's tokens reached the scheduler (async
scheduling) still gets the right placeholder ids and penalty history.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from deepinfer_core.request import PLACEHOLDER_TOKEN_ID
from deepinfer_core.runner.context import SeqSlice
from deepinfer_core.runner.executor import PagedExecutor
from deepinfer_core.runner.sampler import (Sampler, SamplingMetadata, TokenLogprobs, compute_logprobs, gather_logprobs,
                                           position_seed)
from deepinfer_core.sampling_params import SamplingParams
from deepinfer_core.sched_output import SchedulerOutput


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
    """One step's results (CPU): sampled token per sampling request, optional logprobs."""

    sampled: dict[str, list[int]] = field(default_factory=dict)
    logprobs: dict[str, TokenLogprobs] = field(default_factory=dict)
    prompt_logprobs: dict[str, list[PromptLogprob]] = field(default_factory=dict)
    grammar_terminated: set[str] = field(default_factory=set)  # grammar complete after this token
    grammar_errors: dict[str, str] = field(default_factory=dict)  # token rejected by the grammar


class ModelRunner:
    def __init__(self, model, executor: PagedExecutor, sampler: Sampler, eos_token_ids: tuple[int, ...],
                 apply_bitmask: Callable | None = None, grammar=None):
        """``apply_bitmask``: the resolved ``structured.apply_bitmask`` op; ``grammar``: a GrammarBackend
        (None until the first structured request)."""
        self.apply_bitmask = apply_bitmask
        self.grammar = grammar
        self.model = model
        self.executor = executor
        self.sampler = sampler
        self.eos_token_ids = eos_token_ids
        self.requests: dict[str, RunnerRequest] = {}

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

    @torch.inference_mode()
    def execute(self, so: SchedulerOutput) -> StepResult:
        for rid in so.finished_req_ids:
            self.drop(rid)
        result = StepResult()
        if so.is_empty:
            return result
        slices: list[SeqSlice] = []
        ids: list[int] = []
        for s in so.scheduled:
            toks = s.token_ids
            if toks and toks[-1] == PLACEHOLDER_TOKEN_ID:
                toks = toks[:-1] + [self.requests[s.req_id].output_token_ids[-1]]
            ids.extend(toks)
            slices.append(SeqSlice(s.num_computed_tokens, s.num_scheduled_tokens, s.block_tables, s.state_slot,
                                   s.cached_until))
        hidden = self.executor.run(torch.tensor(ids, dtype=torch.long), slices)

        # rows to turn into logits: the last row of every sampling request, and prompt rows
        # whose request asked for prompt logprobs.
        sample_rows, sample_reqs, prompt_rows = [], [], []
        row = 0
        for s in so.scheduled:
            rr = self.requests[s.req_id]
            if rr.params.prompt_logprobs is not None:
                n_prompt = len(rr.prompt_token_ids)
                for j in range(s.num_scheduled_tokens):
                    p = s.num_computed_tokens + j
                    if p + 1 < n_prompt:
                        prompt_rows.append((s.req_id, row + j, p + 1))
            if s.samples:
                sample_rows.append(row + s.num_scheduled_tokens - 1)
                sample_reqs.append(s.req_id)
            row += s.num_scheduled_tokens

        if sample_rows:
            logits = self.model.compute_logits(hidden[sample_rows])
            rrs = [self.requests[r] for r in sample_reqs]
            # A terminated matcher belongs to a request that finished in the step before this one
            # (async scheduling planned this step first): its output here is discarded anyway.
            constrained = [i for i, r in enumerate(rrs) if r.matcher is not None and not r.matcher.is_terminated()]
            if constrained:  # requests without constraints pay nothing
                bitmask = self.grammar.fill_bitmask([rrs[i].matcher for i in constrained], constrained, len(rrs))
                logits = self.apply_bitmask(logits, bitmask)
            for r in rrs:  # draw for position p from a stream keyed by (seed, sequence, p)
                if not r.params.greedy:
                    r.generator.manual_seed(position_seed(r.seed, r.seq_index,
                                                          len(r.prompt_token_ids) + len(r.output_token_ids)))
            meta = SamplingMetadata(
                params=[r.params for r in rrs], output_token_ids=[r.output_token_ids for r in rrs],
                prompt_token_ids=[r.prompt_token_ids for r in rrs], generators=[r.generator for r in rrs],
                eos_token_ids=self.eos_token_ids)
            out = self.sampler(logits, meta)
            tokens = out.token_ids.tolist()
            for i, (rid, rr) in enumerate(zip(sample_reqs, rrs)):
                rr.output_token_ids.append(tokens[i])
                if rr.matcher is not None and not rr.matcher.is_terminated():
                    if not rr.matcher.accept_token(tokens[i]):
                        result.grammar_errors[rid] = f"token {tokens[i]} was rejected by the request's grammar"
                    elif rr.matcher.is_terminated():
                        result.grammar_terminated.add(rid)
                result.sampled[rid] = [tokens[i]]
                lp = out.row_logprobs(i)
                if lp is not None:
                    result.logprobs[rid] = lp
        if prompt_rows:
            self._prompt_logprobs(hidden, prompt_rows, result)
        return result

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
