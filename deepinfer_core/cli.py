"""The ``deepinfer`` console script.

    deepinfer generate --model deepinfer/tiny-v41 --prompt "Hello" --max-tokens 32
    deepinfer chat --model /path/to/DeepSeek-V4.1-Flash-1017 --message "Hi" --thinking
"""
from __future__ import annotations

import argparse
import json
import sys


def _engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="local checkpoint dir, hub id, or embedded name (deepinfer/tiny-v41, deepinfer/tiny-v4); "
                   "default: deepseek-ai/DeepSeek-V4.1-Flash-1017")
    p.add_argument("--dtype", default="auto", help="auto | bfloat16 | float32 | float16")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--kv-cache-memory-bytes", type=int, default=None)
    p.add_argument("--no-async-scheduling", action="store_true")
    p.add_argument("--no-chain-steps", action="store_true",
                   help="async scheduling: finish each step before launching the next (for A/B runs)")
    p.add_argument("--seed", type=int, default=0)


def _sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--sampling-seed", type=int, default=None)
    p.add_argument("--json", action="store_true", help="print one JSON object per output")


def _make_llm(a):
    from deepinfer_core.hub import DEFAULT_MODEL
    from deepinfer_core.llm import LLM

    return LLM(a.model or DEFAULT_MODEL, dtype=a.dtype, max_model_len=a.max_model_len, max_num_seqs=a.max_num_seqs,
               max_num_batched_tokens=a.max_num_batched_tokens, kv_cache_memory_bytes=a.kv_cache_memory_bytes,
               async_scheduling=not a.no_async_scheduling, chain_steps=not a.no_chain_steps, seed=a.seed)


def _params(a):
    from deepinfer_core.sampling_params import SamplingParams

    return SamplingParams(max_tokens=a.max_tokens, temperature=a.temperature, top_p=a.top_p, top_k=a.top_k,
                          seed=a.sampling_seed)


def _print(outputs, as_json: bool) -> int:
    rc = 0
    for out in outputs:
        if out.error:
            rc = 1
        if as_json:
            print(json.dumps({"prompt": out.prompt, "text": out.outputs[0].text, "token_ids": out.outputs[0].token_ids,
                              "finish_reason": out.outputs[0].finish_reason, "error": out.error}, ensure_ascii=False))
        elif out.error:
            print(f"error: {out.error}", file=sys.stderr)
        else:
            print(f"Prompt: {out.prompt!r}\nGenerated: {out.outputs[0].text!r}\n")
    return rc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="deepinfer", description="DeepInfer: offline inference for DeepSeek-V4.x")
    sub = parser.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="complete one or more prompts")
    _engine_args(g)
    _sampling_args(g)
    g.add_argument("--prompt", action="append", required=True, help="a prompt (repeat for a batch)")
    c = sub.add_parser("chat", help="one chat turn rendered with DeepSeek's own encoding")
    _engine_args(c)
    _sampling_args(c)
    c.add_argument("--message", required=True)
    c.add_argument("--system", default=None)
    c.add_argument("--thinking", action="store_true")
    t = sub.add_parser("make-tiny", help="write a tiny random checkpoint in the native layout (for tests/benchmarks)")
    t.add_argument("out_dir")
    t.add_argument("--quant", default="fp8", choices=["none", "fp8", "fp4"])
    t.add_argument("--seed", type=int, default=0)
    a = parser.parse_args(argv)

    if a.cmd == "make-tiny":
        from deepinfer_core.models import model_registries

        for mod in model_registries():
            writer = getattr(mod, "write_default_tiny", None)
            if writer is not None:
                print(writer(a.out_dir, quant=a.quant, seed=a.seed))
                return 0
        print("error: no model package with a tiny checkpoint writer is installed (pip install deepinfer-models)",
              file=sys.stderr)
        return 2
    llm = _make_llm(a)
    if a.cmd == "generate":
        return _print(llm.generate(a.prompt, _params(a), use_tqdm=False), a.json)
    msgs = ([{"role": "system", "content": a.system}] if a.system else []) + [{"role": "user", "content": a.message}]
    return _print(llm.chat(msgs, _params(a), use_tqdm=False, thinking=a.thinking), a.json)


if __name__ == "__main__":
    raise SystemExit(main())
