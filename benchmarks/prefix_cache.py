"""Prefix caching on shared-prefix workloads: tokens computed and time, with and without caching.

    python benchmarks/prefix_cache.py                      # tiny generated V4.1 checkpoint, CPU (--family v4)
    python benchmarks/prefix_cache.py --model DIR --dtype bfloat16

Workloads: (1) one long system prompt + many short questions; (2) a multi-turn chat where each
turn resends the whole conversation. Both engines see the same requests in the same order;
"tokens computed" counts every token fed to the model (prefill, replay and decode).
"""
from __future__ import annotations

import argparse
import tempfile
import time

import torch


def rand(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 129000, (n,), generator=g).tolist()


def run(model, dtype, caching: bool, workload: str, args):
    from deepinfer_core import LLM, SamplingParams

    llm = LLM(model, dtype=dtype, max_model_len=4096, enable_prefix_caching=caching,
              kv_cache_memory_bytes=512 << 20)
    eng = llm.llm_engine
    fed = {"n": 0}
    orig = eng.runner.execute

    def counting(so):
        fed["n"] += so.total_num_scheduled_tokens
        return orig(so)

    eng.runner.execute = counting
    sp = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    t0 = time.perf_counter()
    outs = []
    if workload == "system+questions":
        system = rand(args.system_len, 1)
        prompts = [system + rand(args.question_len, 100 + i) for i in range(args.num_questions)]
        outs = llm.generate(prompts, sp, use_tqdm=False)
    else:
        conv = rand(args.system_len, 2)
        for turn in range(args.num_turns):
            conv = conv + rand(args.question_len, 200 + turn)
            out = llm.generate([conv], sp, use_tqdm=False)[0]
            conv = conv + out.outputs[0].token_ids
            outs.append(out)
    dt = time.perf_counter() - t0
    return fed["n"], dt, [o.outputs[0].token_ids for o in outs], eng.prefix_cache_stats()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--system-len", type=int, default=1024)
    ap.add_argument("--question-len", type=int, default=32)
    ap.add_argument("--num-questions", type=int, default=16)
    ap.add_argument("--num-turns", type=int, default=6)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--family", default="v41", choices=["v41", "v4"], help="tiny checkpoint family when --model is unset")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = args.model
    if model is None:
        from deepinfer_models.testing import write_tiny_v4_checkpoint, write_tiny_v41_checkpoint

        model = tempfile.mkdtemp(prefix="deepinfer_prefix_")
        writer = write_tiny_v41_checkpoint if args.family == "v41" else write_tiny_v4_checkpoint
        writer(model, quant="fp8", seed=0)
    print(f"model={model} dtype={args.dtype} threads={torch.get_num_threads()}")
    print(f"{'workload':<18}{'caching':>8}{'tokens fed':>12}{'seconds':>9}{'hit rate':>10}")
    for workload in ("system+questions", "multi-turn"):
        rows = {}
        for caching in (False, True):
            n, dt, toks, stats = run(model, args.dtype, caching, workload, args)
            rows[caching] = (n, dt, toks)
            print(f"{workload:<18}{'on' if caching else 'off':>8}{n:>12}{dt:>9.2f}{stats['hit_rate']:>10.2f}")
        same = rows[True][2] == rows[False][2]
        print(f"{workload:<18} tokens fed off/on = {rows[False][0] / rows[True][0]:.2f}x, "
              f"time off/on = {rows[False][1] / rows[True][1]:.2f}x, outputs identical: {same}")


if __name__ == "__main__":
    main()
