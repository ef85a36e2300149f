"""LLMEngine: add requests, step, collect RequestOutputs (vLLM's LLMEngine shape).

Flow per step: Scheduler.schedule() -> ModelRunner.launch() / finish() -> Scheduler.update_from_output()
-> OutputProcessor. With async scheduling (default) the model step runs on a worker
thread while the scheduler plans the next step; only sampled token ids come back. When the
planned step is *simple* (``ModelRunner.is_simple``: plain greedy or seeded sampling), it is launched
behind the running one before that one's tokens reach the host (its decode ids are read on the
device), so the device never waits for the host's packing, output processing or planning.
Outputs are identical with async on and off (tests/engine/test_engine_invariants.py,
tests/engine/test_chained_steps.py).
"""
from __future__ import annotations

import hashlib
import itertools
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any


from deepinfer_core.config import EngineConfig
from deepinfer_core.engine.model_runner import LaunchedStep, ModelRunner, StepResult
from deepinfer_core.engine.output_processor import OutputProcessor
from deepinfer_core.hub import resolve_model_path
from deepinfer_core.kernels.mode import batch_invariant_enabled, kernel_mode
from deepinfer_core.kernels.registry import get_registry
from deepinfer_core.kernels.resolve import resolve_kernels
from deepinfer_core.kv.host_tier import HostTier
from deepinfer_core.kv.manager import KVCacheManager, bytes_per_block_id, num_blocks_from_memory_budget
from deepinfer_core.kv.spec import StateSpec
from deepinfer_core.models import chat_encoding, model_loader, read_architecture, register_embedded_models
from deepinfer_core.outputs import RequestOutput
from deepinfer_core.platform.loader import current_platform
from deepinfer_core.request import Request, RequestStatus
from deepinfer_core.runner.decode_graphs import DEFAULT_BATCH_SIZES
from deepinfer_core.runner.executor import STEP_KERNEL_OPS, PagedExecutor, group_specs
from deepinfer_core.runner.host_store import HostKVStore
from deepinfer_core.runner.sampler import Sampler, make_generator
from deepinfer_core.sampling_params import SamplingParams
from deepinfer_core.scheduler import Scheduler, SchedulerConfig
from deepinfer_core.spec_decode.confidence import AUTO_MARGIN, ConfidenceScheduler, StepCostModel
from deepinfer_core.spec_decode.cost_model import BatchCostModel, is_batched_table
from deepinfer_core.spec_decode.profile import profile_step_costs
from deepinfer_core.spec_decode.config import SpeculativeConfig
from deepinfer_core.spec_decode.draft_runner import DraftRunner
from deepinfer_core.spec_decode.stats import SpecDecodeStats
from deepinfer_core.sched_output import SchedulerOutput
from deepinfer_core.tokenizer import load_tokenizer

logger = logging.getLogger(__name__)

DEFAULT_CPU_KV_BYTES = 1 << 30


class InvalidRequestError(ValueError):
    """A request that cannot be served (bad prompt or parameters); other requests are unaffected."""


def _derived_seed(engine_seed: int, request_index: int) -> int:
    h = hashlib.blake2b(f"{engine_seed}:{request_index}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & ((1 << 63) - 1)


class LLMEngine:
    def __init__(self, config: EngineConfig, platform=None, model_dir: Path | None = None):
        self.config = config
        self.platform = platform or current_platform()
        register_embedded_models()
        self.model_dir = Path(model_dir) if model_dir is not None else resolve_model_path(config.model, config.revision)
        self.architecture = read_architecture(self.model_dir)
        loader = model_loader(self.architecture)
        device = self.platform.device()
        t0 = time.perf_counter()
        self.batch_invariant = config.batch_invariant or batch_invariant_enabled()
        with kernel_mode(batch_invariant=self.batch_invariant):
            self.model = loader(self.model_dir, dtype=config.dtype, device=device, platform=self.platform,
                                kernel_overrides=config.kernel_overrides or None, block_size=config.block_size)
        logger.info("loaded %s (%s) in %.1fs", self.model_dir, self.architecture, time.perf_counter() - t0)
        self.tokenizer = load_tokenizer(config.tokenizer or self.model_dir)
        self.chat_encoding = chat_encoding(self.architecture)
        self.vocab_size = self.model.cfg.vocab_size

        self.spec_config = SpeculativeConfig.from_user(config.speculative_config)
        proposer = self._load_proposer() if self.spec_config is not None else None
        specs = {**self.model.kv_cache_specs(), **(proposer.kv_cache_specs() if proposer else {})}
        budget = config.kv_cache_memory_bytes or self._default_budget()
        gspecs, _, members = group_specs(specs)
        groups = [gspecs[g] for g in range(len(gspecs))]
        layers_per_group = {g: len(names) for g, names in members.items()}
        per_block = bytes_per_block_id(groups, layers_per_group)
        num_blocks = num_blocks_from_memory_budget(groups, layers_per_group, budget)
        # Decode steps replay captured graphs where the platform has them (None on the CPU platform).
        graphs = self.platform.capabilities.graph_capture and not config.enforce_eager
        with kernel_mode(batch_invariant=self.batch_invariant):
            step_kernels = resolve_kernels(STEP_KERNEL_OPS, self.platform, config.kernel_overrides or None)
        self.executor = PagedExecutor(self.model, num_blocks, config.max_num_seqs, device, kernels=step_kernels,
                                      extra_specs=proposer.kv_cache_specs() if proposer else None,
                                      graph_runner=self.platform.graph_runner if graphs else None,
                                      graph_batch_sizes=tuple(config.graph_capture_sizes) or DEFAULT_BATCH_SIZES,
                                      max_context=config.max_model_len,
                                      max_query_len=1 + (proposer.num_draft_tokens if proposer else 0))
        states = [s for s in specs.values() if isinstance(s, StateSpec)]
        replay = getattr(self.model, "prefix_replay_tokens", lambda: 0)()
        # Prefix-cache host tier: the store holds the host tensors, the HostTier (inside the KV
        # manager) decides what moves; copies flow through _host_copies_then (kv/host_tier.py).
        use_host = bool(config.host_kv_cache_bytes) and config.enable_prefix_caching
        self.host_store = HostKVStore(self.executor) if use_host else None
        host = HostTier(config.host_kv_cache_bytes, self.host_store.block_bytes()) if use_host else None
        history = getattr(self.model, "prefix_history_tokens", lambda: 0)()
        self.kv = KVCacheManager(groups, states, num_blocks, config.max_num_seqs,
                                 enable_caching=config.enable_prefix_caching, replay_tokens=replay, host_tier=host,
                                 replay_mode=config.prefix_replay, history_tokens=history,
                                 replay_window=config.prefix_replay_window)
        # V4.1 decoder-side replay (late layers on each request's last window of rows); a model
        # without it ignores the setting
        getattr(self.model, "set_decoder_replay", lambda on: None)(config.use_decoder_replay)
        n_spec = proposer.num_draft_tokens if proposer else 0
        self.scheduler = Scheduler(SchedulerConfig(
            max_num_seqs=config.max_num_seqs, max_num_batched_tokens=config.max_num_batched_tokens,
            enable_chunked_prefill=config.enable_chunked_prefill, max_model_len=config.max_model_len,
            num_speculative_tokens=n_spec), self.kv)
        self.confidence = self._confidence_scheduler(proposer)
        eos = tuple(x for x in (self.tokenizer.eos_token_id,) if x is not None)
        self.eos_token_ids = eos
        _, apply_bitmask = get_registry().resolve("structured.apply_bitmask", self.platform.default_providers,
                                                  config.kernel_overrides or None, batch_invariant=self.batch_invariant)
        drafter = DraftRunner(proposer, self.executor, self.spec_config.draft_sample_method) if proposer else None
        self.runner = ModelRunner(self.model, self.executor, Sampler(seed=config.seed), eos, apply_bitmask,
                                  drafter=drafter, confidence=self.confidence)
        self.outputs = OutputProcessor(self.tokenizer)
        self._request_counter = itertools.count()
        self._children: dict[str, list[str]] = {}
        self._emitted: dict[str, int] = {}
        self.spec_stats = SpecDecodeStats(n_spec) if n_spec else None
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="deepinfer-step") if config.async_scheduling else None
        self._inflight: tuple[SchedulerOutput, Future] | None = None
        # launch simple steps behind the running one (``config.chain_steps``; may be switched between
        # generate calls, as benchmarks/engine_decode.py does for its A/B runs)
        self.chain_steps = config.chain_steps
        # Where an async step runs: on the worker (default), or on the calling thread while the worker
        # plans the next step (platforms whose kernels use the calling thread's CPU thread pool; see
        # CpuPlatform.steps_on_calling_thread). ``_pending``: the planned step not yet run, then.
        self._steps_here = bool(getattr(self.platform, "steps_on_calling_thread", False))
        self._pending: tuple[SchedulerOutput, Any] | None = None
        logger.info("KV cache: %d blocks x %d B per block id (%d groups)", num_blocks, per_block, len(groups))
        if self.executor.graphs is not None:  # capture every batch bucket now, before serving (and profiling)
            t0 = time.perf_counter()
            n = self.executor.graphs.warmup((1, 1 + n_spec) if n_spec else (1,),
                                            tuple(proposer.tap_layer_ids) if proposer else (), n_spec)
            logger.info("captured %d decode graphs in %.1fs", n, time.perf_counter() - t0)
        if self.confidence is not None and self.spec_config.cost_table == "profile":
            self._profile_step_costs()

    def prefix_cache_stats(self) -> dict[str, float]:
        """Prefix-cache metrics since start: tokens looked up, tokens served, hit rate, evictions."""
        q, h = self.kv.num_query_tokens, self.kv.num_hit_tokens
        stats = {"query_tokens": q, "hit_tokens": h, "hit_rate": h / q if q else 0.0,
                 "cached_blocks": self.kv.pool.num_cached_blocks, "evictions": self.kv.pool.num_evictions}
        host = self.kv.host  # host tier (planned state: copies of a step not yet run are counted)
        stats.update({"host_hits": host.num_hits if host else 0,
                      "host_blocks_spilled": host.num_spilled if host else 0,
                      "host_blocks_restored": host.num_restored if host else 0,
                      "host_evictions": host.num_evictions if host else 0,
                      "host_blocks": host.num_blocks if host else 0,
                      "host_bytes": host.bytes_used if host else 0})
        return stats

    def _load_proposer(self):
        """The model's draft model for ``speculative_config`` (built by the model package)."""
        load = getattr(self.model, "load_proposer", None)
        if load is None:
            raise ValueError(f"speculative_config: {self.architecture} has no speculative proposer "
                             f"(method {self.spec_config.method!r})")
        with kernel_mode(batch_invariant=self.batch_invariant):
            return load(self.model_dir, self.spec_config, platform=self.platform,
                        kernel_overrides=self.config.kernel_overrides or None)

    def _confidence_scheduler(self, proposer) -> ConfidenceScheduler | None:
        if proposer is None:
            return None
        want = self.spec_config.confidence_scheduling
        if want is True and not proposer.has_confidence:
            raise ValueError("speculative_config: confidence_scheduling=True but the checkpoint's draft model "
                             "has no confidence head")
        if want is False or (want == "auto" and not proposer.has_confidence):
            return None
        table = self.spec_config.cost_table
        if table is None or table == "profile":  # "profile": replaced by the measured table in __init__
            model = BatchCostModel()
        else:
            model = BatchCostModel(table) if is_batched_table(table) else StepCostModel(table)
        return ConfidenceScheduler(proposer.num_draft_tokens, model, self.spec_config.min_batch_for_confidence,
                                   margin=AUTO_MARGIN if want == "auto" else 0.0, explore=not model.fixed)

    def _profile_step_costs(self) -> None:
        """``cost_table="profile"``: time real steps at every (batch size, drafts per request) now."""
        t0 = time.perf_counter()
        table = profile_step_costs(self)
        self.confidence.cost_model = BatchCostModel(table)
        self.confidence.explore = False
        self.reset_spec_decode_stats()  # serving metrics start now
        logger.info("profiled the verification step-cost table in %.1fs: %s", time.perf_counter() - t0, table)

    def reset_spec_decode_stats(self) -> None:
        """Start the speculative-decoding counters again (benchmarks: one engine, several measured runs)."""
        if self.spec_stats is not None:
            self.spec_stats = SpecDecodeStats(self.spec_stats.num_speculative_tokens)

    def spec_decode_stats(self) -> dict | None:
        """Speculative-decoding metrics since start (None when it is off), plus the step-cost table."""
        st = self.spec_stats
        if st is None:
            return None
        out = st.as_dict()
        conf = self.confidence
        out["cost_table"] = conf.cost_model.table() if conf is not None else None
        return out

    def _run(self, so: SchedulerOutput) -> StepResult:
        """Run a step on this thread."""
        return self._timed(self._host_copies_then(self.runner.execute), so)

    def _timed(self, execute, so: SchedulerOutput) -> Any:
        """``execute(so)``, timed for the verification cost model (runs on the worker in async mode)."""
        t0 = time.perf_counter()
        result = execute(so)
        if not so.is_empty and self.confidence is not None:
            self.confidence.observe_step(time.perf_counter() - t0)
        return result

    def _default_budget(self) -> int:
        if self.platform.device_type == "cpu":
            return DEFAULT_CPU_KV_BYTES
        return int(self.platform.total_memory_bytes() * self.config.gpu_memory_utilization)

    # -- requests ------------------------------------------------------------
    def tokenize_prompt(self, prompt: Any) -> tuple[str | None, list[int]]:
        """A prompt is a str, a list of token ids, or a dict with ``prompt`` / ``prompt_token_ids``."""
        if isinstance(prompt, dict):
            if "multi_modal_data" in prompt or "images" in prompt:
                raise InvalidRequestError("image inputs are not supported yet: DeepInfer serves the text model only")
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), list(prompt["prompt_token_ids"])
            prompt = prompt.get("prompt")
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidRequestError("prompt is empty")
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, (list, tuple)):
            return None, list(prompt)
        raise InvalidRequestError(f"prompt must be a str, a list of token ids or a dict, got {type(prompt).__name__}")

    def add_request(self, request_id: str, prompt: Any, params: SamplingParams, arrival: float | None = None) -> None:
        """Validate and queue one request (``n`` sequences). Raises InvalidRequestError for bad input."""
        if request_id in self._children:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError(f"sampling params must be a SamplingParams, got {type(params).__name__}")
        try:
            params.validate()
        except (ValueError, TypeError) as exc:
            raise InvalidRequestError(f"invalid sampling parameters: {exc}") from None
        text, ids = self.tokenize_prompt(prompt)
        if not ids:
            raise InvalidRequestError("prompt is empty (no tokens)")
        for i, t in enumerate(ids):
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.vocab_size:
                raise InvalidRequestError(f"prompt token {i} is {t!r}, outside the vocabulary [0, {self.vocab_size})")
        if len(ids) >= self.config.max_model_len:
            raise InvalidRequestError(
                f"prompt has {len(ids)} tokens but max_model_len is {self.config.max_model_len}")
        compiled = None
        if params.structured_outputs is not None:
            compiled = self._compile_grammar(params.structured_outputs)
        index = next(self._request_counter)
        base_seed = params.seed if params.seed is not None else _derived_seed(self.config.seed, index)
        arrival = time.monotonic() if arrival is None else arrival
        children = [request_id if params.n == 1 else f"{request_id}#{i}" for i in range(params.n)]
        reqs = []
        for i, cid in enumerate(children):
            try:
                reqs.append(Request(cid, ids, params, arrival=arrival, eos_token_id=self.eos_token_ids))
            except (ValueError, TypeError) as exc:
                raise InvalidRequestError(str(exc)) from None
        for i, (cid, req) in enumerate(zip(children, reqs)):
            try:
                self.scheduler.add_request(req)
            except ValueError as exc:
                for done in children[:i]:
                    self.scheduler.abort_request(done)
                raise InvalidRequestError(str(exc)) from None
        for i, cid in enumerate(children):
            gen = make_generator(base_seed, i, device=self.platform.device())
            matcher = self.runner.grammar.matcher(compiled) if compiled is not None else None
            self.runner.add_request(cid, params, ids, gen, matcher=matcher, seed=base_seed, seq_index=i)
            self._emitted[cid] = 0
        self._children[request_id] = children
        self.outputs.add(request_id, text, ids, params, children)

    def _compile_grammar(self, so_params):
        """Compile (cached) when the request is added: never inside a model step."""
        from deepinfer_core.structured.xgrammar_backend import GrammarBackend, GrammarError

        if self.runner.grammar is None:
            self.runner.grammar = GrammarBackend(self.tokenizer, self.vocab_size, list(self.eos_token_ids))
        try:
            return self.runner.grammar.compile(so_params)
        except GrammarError as exc:
            raise InvalidRequestError(str(exc)) from None

    def abort_request(self, request_id: str) -> None:
        for cid in self._children.get(request_id, []):
            if self.scheduler.abort_request(cid):
                self.outputs.finish(cid, "abort")

    def has_unfinished_requests(self) -> bool:
        return (self.scheduler.has_unfinished() or self._inflight is not None or self._pending is not None
                or bool(self.outputs.parents))

    # -- stepping ------------------------------------------------------------
    def _host_copies_then(self, execute):
        """``execute`` preceded by the host-tier copies the KV manager recorded so far.

        Called on this thread right before a step is handed to the device, with no step in
        flight and no schedule() since the one that planned it, so the copies run after every
        earlier step and before this one (the invariant in deepinfer_core/kv/host_tier.py).
        """
        ops = self.kv.take_host_copies()
        if not ops:
            return execute

        def run(so: SchedulerOutput) -> StepResult:
            self.host_store.apply(ops)
            return execute(so)
        return run

    def _submit(self, so: SchedulerOutput, prev: LaunchedStep | None = None, simple: bool | None = None) -> Future:
        """Launch ``so`` on the worker (-> Future of its ``LaunchedStep``); ``prev``: the unfinished step
        it is chained behind; ``simple``: ``runner.is_simple(so)`` when already known."""
        assert self._worker is not None
        # host copies are taken now (in step order), applied on the worker just before the step
        launch = self._host_copies_then(lambda s: self.runner.launch(s, prev, simple))
        return self._worker.submit(self._timed, launch, so)

    def step(self) -> list[RequestOutput]:
        """Run one step; returns the RequestOutputs of requests that finished in it."""
        if self._worker is None:
            so = self.scheduler.schedule()
            return self._process(so, self._run(so))
        if self._steps_here:
            return self._step_here()
        if self._inflight is None:
            so = self.scheduler.schedule()
            if so.is_empty:
                return self._process(so, self.runner.execute(so))
            self._inflight = (so, self._submit(so))
        nxt = self.scheduler.schedule()  # plan step N+1 while step N runs
        so, fut = self._inflight
        launched = fut.result()
        chained = None
        # Chain N+1 behind N before N's tokens reach the host, unless it needs them there (or host-tier
        # copies must run between the two steps: they assume no step in flight).
        if self.chain_steps and self.runner.can_chain(nxt) and not self.kv.has_host_copies():
            chained = self._submit(nxt, prev=launched, simple=True)  # can_chain answered is_simple
        result = self._worker.submit(self.runner.finish, launched).result()  # after N+1's launch: FIFO
        finished = self._process(so, result)
        if chained is not None:
            self._inflight = (nxt, chained)
        elif nxt.is_empty:
            self._inflight = None
            finished += self._process(nxt, self.runner.execute(nxt))
        else:
            self._inflight = (nxt, self._submit(nxt))
        return finished

    def _step_here(self) -> list[RequestOutput]:
        """Async step with the roles swapped: step N runs on this thread while the worker plans step
        N+1 (same overlap, same order of schedule / host copies / process as ``step``). On the CPU the
        step's kernels run on the calling thread's OpenMP pool; running them on the worker instead
        gives a second pool (the one that loaded the model stays), more spinning threads than cores,
        and libgomp then parks its threads after every parallel region (docs/speculative_decoding.md)."""
        if self._pending is None:
            so = self.scheduler.schedule()
            if so.is_empty:
                return self._process(so, self.runner.execute(so))
            self._pending = (so, self._host_copies_then(self.runner.execute))
        so, execute = self._pending
        planned = self._worker.submit(self.scheduler.schedule)  # plan step N+1 while step N runs here
        try:
            result = self._timed(execute, so)
        finally:
            nxt = planned.result()  # never leave the scheduler mid-plan, even when the step raised
        finished = self._process(so, result)
        if nxt.is_empty:
            self._pending = None
            finished += self._process(nxt, self.runner.execute(nxt))
        else:
            self._pending = (nxt, self._host_copies_then(self.runner.execute))
        return finished

    def _process(self, so: SchedulerOutput, result: StepResult) -> list[RequestOutput]:
        for cid, items in result.prompt_logprobs.items():
            self.outputs.add_prompt_logprobs(cid, items)
        updated = self.scheduler.update_from_output(so, result.sampled)
        if self.spec_stats is not None:
            self.spec_stats.num_target_steps += not so.is_empty
            for cid, (proposed, verified) in result.spec_counts.items():
                self.spec_stats.observe(proposed, verified, len(result.sampled.get(cid, [0])) - 1)
        for cid, (tokens, _) in result.drafts.items():
            self.scheduler.set_drafts(cid, tokens)
        grammar_done = result.grammar_terminated
        grammar_err = result.grammar_errors
        parents_touched = set()
        for req in updated:
            cid = req.request_id
            if cid not in self._emitted:
                continue
            new = req.output_token_ids[self._emitted[cid]:]
            self._emitted[cid] = len(req.output_token_ids)
            pid = self.outputs.parent_of.get(cid)
            if pid is None:
                continue
            parents_touched.add(pid)
            if req.status is RequestStatus.FINISHED_ERROR:
                self.outputs.finish(cid, "error", error=req.error)
                continue
            lps = result.logprobs.get(cid) or [None] * len(new)
            lps = lps[:len(new)]
            stop = self.outputs.add_tokens(cid, new, lps) if new else None
            if cid in grammar_err and not req.is_finished:
                self.scheduler.finish_request(cid, RequestStatus.FINISHED_ERROR)
                self.outputs.finish(cid, "error", error=grammar_err[cid])
            elif stop is not None and not req.is_finished:
                self.scheduler.finish_request(cid, RequestStatus.FINISHED_STOPPED)
                self.outputs.finish(cid, "stop", stop_reason=stop)
            elif cid in grammar_done and not req.is_finished:  # the grammar is complete
                self.scheduler.finish_request(cid, RequestStatus.FINISHED_STOPPED)
                self.outputs.finish(cid, "stop", stop_reason=new[-1])
            elif req.is_finished:
                self.outputs.finish(cid, req.status.finish_reason, stop_reason=req.stop_reason)
        done = []
        for pid in parents_touched | {p for p in list(self.outputs.parents) if self.outputs.parents[p].finished}:
            out = self.outputs.pop_if_finished(pid)
            if out is not None:
                for cid in self._children.pop(pid, []):
                    self._emitted.pop(cid, None)
                done.append(out)
        return done

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.shutdown(wait=True)
