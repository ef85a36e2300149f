"""``LLM``: the offline entry point with vLLM's names (``generate``, ``chat``)."""
from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from tqdm.auto import tqdm

from deepinfer_core.chat import encode_chat
from deepinfer_core.config import EngineConfig, parse_dtype
from deepinfer_core.engine.llm_engine import InvalidRequestError, LLMEngine
from deepinfer_core.hub import DEFAULT_MODEL, resolve_model_path
from deepinfer_core.models import register_embedded_models
from deepinfer_core.outputs import CompletionOutput, RequestOutput
from deepinfer_core.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


def _error_output(request_id: str, prompt: Any, exc: Exception) -> RequestOutput:
    text = prompt if isinstance(prompt, str) else None
    ids = list(prompt) if isinstance(prompt, (list, tuple)) else None
    return RequestOutput(request_id, text, ids, None,
                         [CompletionOutput(0, "", [], finish_reason="error")], True, error=str(exc))


class LLM:
    """``LLM(model=...)``: load once, then ``generate`` / ``chat`` batches.

    ``model`` is a local checkpoint directory, a Hugging Face hub id (downloaded into
    the standard cache), or an embedded tiny checkpoint name such as ``deepinfer/tiny-v41`` (or ``deepinfer/tiny-v4``).
    Unknown keyword arguments are rejected (no silent typos).
    """

    def __init__(self, model: str = DEFAULT_MODEL, dtype: str = "auto", max_model_len: int = 4096,
                 max_num_seqs: int = 64, max_num_batched_tokens: int = 2048, enable_chunked_prefill: bool = True,
                 async_scheduling: bool = True, block_size: int = 64, kv_cache_memory_bytes: int | None = None,
                 gpu_memory_utilization: float = 0.9, seed: int = 0, tokenizer: str | None = None,
                 revision: str | None = None, kernel_overrides: dict | None = None, platform=None,
                 batch_invariant: bool = False, enable_prefix_caching: bool = True,
                 speculative_config: dict | None = None,
                 host_kv_cache_bytes: int = 0, enforce_eager: bool = False,
                 graph_capture_sizes: Sequence[int] | None = None, prefix_replay: str = "exact",
                 decoder_replay: bool | None = None, prefix_replay_window: int | None = None,
                 chain_steps: bool = True):
        register_embedded_models()
        model_dir = resolve_model_path(model, revision)
        try:
            torch_dtype = json.loads((model_dir / "config.json").read_text()).get("torch_dtype", "bfloat16")
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot read {model_dir}/config.json: {exc}") from None
        cfg = EngineConfig(model=model, dtype=parse_dtype(dtype, torch_dtype), max_model_len=max_model_len,
                           max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                           enable_chunked_prefill=enable_chunked_prefill, async_scheduling=async_scheduling,
                           block_size=block_size, kv_cache_memory_bytes=kv_cache_memory_bytes,
                           gpu_memory_utilization=gpu_memory_utilization, seed=seed,
                           kernel_overrides=dict(kernel_overrides or {}), tokenizer=tokenizer, revision=revision,
                           batch_invariant=batch_invariant, enable_prefix_caching=enable_prefix_caching,
                           speculative_config=speculative_config,
                           host_kv_cache_bytes=host_kv_cache_bytes, enforce_eager=enforce_eager,
                           graph_capture_sizes=tuple(graph_capture_sizes or ()), prefix_replay=prefix_replay,
                           decoder_replay=decoder_replay, prefix_replay_window=prefix_replay_window,
                           chain_steps=chain_steps)
        self.llm_engine = LLMEngine(cfg, platform=platform, model_dir=model_dir)
        self._counter = 0

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    def generate(self, prompts: Any, sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Generate for one prompt or a list (str, token-id list, or ``{"prompt_token_ids": [...]}``).

        Returns one RequestOutput per prompt, in input order. A bad prompt or parameter set
        yields an output with ``error`` set and ``finish_reason == "error"``; the others run.
        """
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(f"got {len(params)} sampling params for {len(prompts)} prompts")
        return self._run(prompts, params, use_tqdm)

    def chat(self, messages: Any, sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
             use_tqdm: bool = True, thinking: bool = False, tools: list | None = None,
             chat_template_kwargs: dict | None = None) -> list[RequestOutput]:
        """Chat completion for one conversation (list of messages) or a list of conversations.

        Rendered with DeepSeek's own encoding (deepseek-recipe) for the checkpoint's family;
        ``thinking`` turns thinking mode on (also accepted in ``chat_template_kwargs``).
        """
        kw = dict(chat_template_kwargs or {})
        thinking = bool(kw.pop("thinking", kw.pop("enable_thinking", thinking)))
        convs = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        engine = self.llm_engine
        prompts: list[Any] = []
        for conv in convs:
            try:
                ids = encode_chat(conv, engine.tokenizer, encoding=engine.chat_encoding, thinking=thinking,
                                  tools=tools, **kw)
                prompts.append({"prompt_token_ids": ids})
            except ValueError as exc:
                prompts.append(exc)  # reported as that conversation's error output
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params or SamplingParams()] * len(prompts)
        else:
            params = list(sampling_params)
        return self._run(prompts, params, use_tqdm)

    def _run(self, prompts: list[Any], params: list[SamplingParams], use_tqdm: bool) -> list[RequestOutput]:
        engine = self.llm_engine
        results: dict[str, RequestOutput] = {}
        order: list[str] = []
        for prompt, sp in zip(prompts, params):
            rid = str(self._counter)
            self._counter += 1
            order.append(rid)
            if isinstance(prompt, Exception):
                results[rid] = _error_output(rid, None, prompt)
                continue
            try:
                engine.add_request(rid, prompt, sp)
            except InvalidRequestError as exc:
                results[rid] = _error_output(rid, prompt, exc)
        bar = tqdm(total=len(order), desc="Processed prompts", disable=not use_tqdm, initial=len(results))
        try:
            while engine.has_unfinished_requests():
                for out in engine.step():
                    results[out.request_id] = out
                    bar.update(1)
        finally:
            bar.close()
        return [results[r] for r in order]
