"""ModelRunner: SchedulerOutput -> step inputs -> model -> logits -> sampled tokens.

Runs on the engine's worker (a thread in async mode); steps execute strictly in
order. The runner keeps, per request, the token history it has sampled itself,
so a step planned before the previous step's tokens reached the scheduler (async
scheduling) still gets the right placeholder ids and penalty history.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from deepinfer_core.request import PLACEHOLDER_TOKEN_ID
from deepinfer_core.runner.context import SeqSlice
from deepinfer_core.runner.executor import PagedExecutor
from deepinfer_core.runner.sampler import Sampler, SamplingMetadata, TokenLogprobs, compute_logprobs, gather_logprobs
from deepinfer_core.sampling_params import SamplingParams
from deepinfer_core.sched_output import SchedulerOutput


@dataclass
class RunnerRequest:
    """What the runner remembers of a sequence (CPU)."""

    params: SamplingParams
    prompt_token_ids: list[int]
    generator: torch.Generator
    output_token_ids: list[int] = field(default_factory=list)


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


class ModelRunner:
    def __init__(self, model, executor: PagedExecutor, sampler: Sampler, eos_token_ids: tuple[int, ...]):
        self.model = model
        self.executor = executor
        self.sampler = sampler
        self.eos_token_ids = eos_token_ids
        self.requests: dict[str, RunnerRequest] = {}

    def add_request(self, req_id: str, params: SamplingParams, prompt_token_ids: list[int], generator: torch.Generator,
                    output_token_ids: list[int] | None = None) -> None:
        self.requests[req_id] = RunnerRequest(params, list(prompt_token_ids), generator, list(output_token_ids or []))

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
            slices.append(SeqSlice(s.num_computed_tokens, s.num_scheduled_tokens, s.block_tables, s.state_slot))
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
            meta = SamplingMetadata(
                params=[r.params for r in rrs], output_token_ids=[r.output_token_ids for r in rrs],
                prompt_token_ids=[r.prompt_token_ids for r in rrs], generators=[r.generator for r in rrs],
                eos_token_ids=self.eos_token_ids)
            out = self.sampler(logits, meta)
            tokens = out.token_ids.tolist()
            for i, (rid, rr) in enumerate(zip(sample_reqs, rrs)):
                rr.output_token_ids.append(tokens[i])
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
