"""Turns sampled tokens into vLLM-shaped RequestOutputs: incremental detokenisation,
stop strings, logprobs, and the grouping of ``n > 1`` sequences into one request."""
from __future__ import annotations

from dataclasses import dataclass, field

from deepinfer_core.detokenizer import IncrementalDetokenizer
from deepinfer_core.engine.model_runner import PromptLogprob
from deepinfer_core.outputs import CompletionOutput, Logprob, RequestOutput
from deepinfer_core.runner.sampler import TokenLogprobs
from deepinfer_core.sampling_params import SamplingParams


@dataclass
class SeqState:
    """Output-side state of one sequence (child ``index`` of a parent request)."""

    index: int
    detok: IncrementalDetokenizer | None
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[dict[int, Logprob]] | None = None
    cumulative_logprob: float | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class ParentState:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    seqs: dict[str, SeqState]
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    error: str | None = None

    @property
    def finished(self) -> bool:
        return all(s.finish_reason is not None for s in self.seqs.values())


class OutputProcessor:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.parents: dict[str, ParentState] = {}
        self.parent_of: dict[str, str] = {}
        # text of single token ids for logprob entries: an id always decodes to the same text, and a batch of 64
        # requests with 5 logprobs each asks for ~384 a step (0.3 ms of tokenizer calls a step on a CI core when
        # the ids repeat, docs/performance.md eighteenth pass)
        self._token_text: dict[int, str] = {}

    def add(self, request_id: str, prompt: str | None, prompt_ids: list[int], params: SamplingParams,
            child_ids: list[str]) -> None:
        seqs = {}
        for i, cid in enumerate(child_ids):
            detok = None
            if params.detokenize and self.tokenizer is not None:
                detok = IncrementalDetokenizer(self.tokenizer, prompt_ids, params.skip_special_tokens, params.stop,
                                               params.include_stop_str_in_output)
            seqs[cid] = SeqState(i, detok, logprobs=[] if params.logprobs is not None else None,
                                 cumulative_logprob=0.0 if params.logprobs is not None else None)
            self.parent_of[cid] = request_id
        plp = [None] if params.prompt_logprobs is not None else None
        self.parents[request_id] = ParentState(request_id, prompt, list(prompt_ids), params, seqs, plp)

    def _decoded(self, tid: int) -> str | None:
        """The logprob entry's text of one token id (special tokens kept); None without a tokenizer."""
        if self.tokenizer is None:
            return None
        text = self._token_text.get(tid)
        if text is None:
            text = self._token_text[tid] = self.tokenizer.decode([tid], skip_special_tokens=False)
        return text

    def add_prompt_logprobs(self, child_id: str, items: list[PromptLogprob]) -> None:
        parent = self.parents.get(self.parent_of.get(child_id, ""))
        if parent is None or parent.prompt_logprobs is None or parent.seqs[child_id].index != 0:
            return  # one copy per parent (children share the prompt)
        for it in items:
            if it.position != len(parent.prompt_logprobs):
                continue  # a recomputed prefix after preemption: already recorded
            d = {it.token_id: Logprob(it.logprob, it.rank, self._decoded(it.token_id))}
            for r, (t, lp) in enumerate(zip(it.top_token_ids, it.top_logprobs), start=1):
                d.setdefault(t, Logprob(lp, r, self._decoded(t)))
            parent.prompt_logprobs.append(d)

    def add_tokens(self, child_id: str, new_ids: list[int], logprobs: list[TokenLogprobs | None]) -> str | None:
        """Record accepted tokens; returns the stop string if one was hit (caller finishes the sequence)."""
        parent = self.parents[self.parent_of[child_id]]
        seq = parent.seqs[child_id]
        seq.token_ids.extend(new_ids)
        for lp in logprobs:
            if lp is None or seq.logprobs is None:
                continue
            d = {lp.token_id: Logprob(lp.logprob, lp.rank, self._decoded(lp.token_id))}
            for r, (t, v) in enumerate(zip(lp.top_token_ids, lp.top_logprobs), start=1):
                d.setdefault(t, Logprob(v, r, self._decoded(t)))
            seq.logprobs.append(d)
            seq.cumulative_logprob += lp.logprob
        if seq.detok is None:
            return None
        delta, stop = seq.detok.add_tokens(new_ids)
        seq.text += delta
        if stop is not None:
            seq.text = seq.detok.output_text
        return stop

    def finish(self, child_id: str, reason: str, stop_reason: int | str | None = None, error: str | None = None) -> None:
        parent = self.parents[self.parent_of[child_id]]
        seq = parent.seqs[child_id]
        if seq.finish_reason is not None:
            return
        if seq.detok is not None and not seq.detok.finished:
            seq.text += seq.detok.finish()
        seq.finish_reason, seq.stop_reason = reason, stop_reason
        if error is not None:
            parent.error = error

    def make_output(self, request_id: str) -> RequestOutput:
        p = self.parents[request_id]
        outs = [CompletionOutput(s.index, s.text, list(s.token_ids), s.cumulative_logprob,
                                 s.logprobs, s.finish_reason, s.stop_reason)
                for s in sorted(p.seqs.values(), key=lambda s: s.index)]
        return RequestOutput(request_id, p.prompt, p.prompt_token_ids, p.prompt_logprobs, outs, p.finished,
                             error=p.error)

    def pop_if_finished(self, request_id: str) -> RequestOutput | None:
        p = self.parents.get(request_id)
        if p is None or not p.finished:
            return None
        out = self.make_output(request_id)
        del self.parents[request_id]
        for cid in p.seqs:
            self.parent_of.pop(cid, None)
        return out
