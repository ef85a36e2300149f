"""DSpark speculative decoding: tokens/s and tokens per target step, off vs on vs on + confidence
scheduling, at several batch sizes, measured in the same run.

    python benchmarks/spec_decode.py                       # tiny agreeing V4.1 checkpoint, CPU
    python benchmarks/spec_decode.py --batches 1,8,64 --max-tokens 48 --threads 2 --json out.json
    DEEPINFER_ACCELERATOR=nvidia python3 benchmarks/spec_decode.py --dtype bfloat16   # on a GPU

The default checkpoint is ``agreeing_checkpoint.py``'s: target and DSpark draft follow one
synthetic language (about 3.6 of 5 drafts accepted), so acceptance is real; ``--model DIR``
runs any V4.1 checkpoint with ``mtp.*`` weights (random tiny ones accept ~nothing: that
measures the pure overhead). Every request generates exactly ``--max-tokens`` tokens
(ignore_eos), greedy. "tok/step" = generated tokens / target forward steps (all requests);
"accept" = mean tokens emitted per request per draft step. Outputs of the three modes are
compared (greedy: they must be identical). The confidence mode learns its step-cost table
online (no table given) and prints it.
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def run_mode(model: str, dtype: str, prompts, max_tokens: int, spec, max_num_seqs: int, batch_invariant: bool,
             async_scheduling: bool):
    from deepinfer_core import LLM, SamplingParams

    llm = LLM(model, dtype=dtype, speculative_config=spec, max_num_seqs=max_num_seqs,
              max_num_batched_tokens=max(2048, 8 * len(prompts)), batch_invariant=batch_invariant,
              kv_cache_memory_bytes=1 << 30, async_scheduling=async_scheduling)  # every mode gets the same pool (and engines are built in turn)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    llm.generate([{"prompt_token_ids": prompts[0]}], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    eng = llm.llm_engine
    steps = {"n": 0}
    orig = eng.runner.execute

    def counting(so):
        steps["n"] += not so.is_empty
        return orig(so)

    eng.runner.execute = counting
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    dt = time.perf_counter() - t0
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    stats = eng.spec_decode_stats()
    eng.shutdown()
    del llm, eng
    gc.collect()
    return {"seconds": dt, "tokens": tokens, "tok_s": tokens / dt, "target_steps": steps["n"],
            "tok_per_step": tokens / steps["n"], "stats": stats,
            "outputs": [o.outputs[0].token_ids for o in outs]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="V4.1 checkpoint dir (default: a generated agreeing tiny one)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    ap.add_argument("--batch-invariant", action="store_true", help="LLM(batch_invariant=True) for every mode")
    ap.add_argument("--async-scheduling", choices=("on", "off"), default="on",
                    help="the same for every mode (on a 2-core CPU 'off' is ~3x faster for every mode)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    model = args.model
    lang = None
    if model is None:
        from deepinfer_models.deepseek_v41.agreeing_checkpoint import write_agreeing_v41_checkpoint

        model = tempfile.mkdtemp(prefix="deepinfer-agree-")
        lang = write_agreeing_v41_checkpoint(model)
    modes = {"off": None,
             "dspark": {"num_speculative_tokens": 5, "confidence_scheduling": False},
             "dspark+conf": {"num_speculative_tokens": 5, "confidence_scheduling": True}}
    rows, results = [], {}
    for b in [int(x) for x in args.batches.split(",")]:
        if lang is not None:
            prompts = [lang.prompt(args.prompt_len + i % 7, start_token=lang.tokens[i % len(lang.tokens)])
                       for i in range(b)]
        else:
            g = torch.Generator().manual_seed(b)
            prompts = [torch.randint(3, 129000, (args.prompt_len + i % 7,), generator=g).tolist() for i in range(b)]
        res = {m: run_mode(model, args.dtype, prompts, args.max_tokens, spec, max(b, 1),
                        args.batch_invariant, args.async_scheduling == "on") for m, spec in modes.items()}
        same = all(r["outputs"] == res["off"]["outputs"] for r in res.values())
        for m, r in res.items():
            st = r["stats"] or {}
            rows.append((b, m, r["tok_s"], r["tok_s"] / res["off"]["tok_s"], r["tok_per_step"],
                         st.get("mean_acceptance_length", 1.0), st.get("verified_per_draft_step", 0.0), same))
            results[f"B{b}/{m}"] = {k: v for k, v in r.items() if k != "outputs"}
        if res["dspark+conf"]["stats"]:
            print(f"B={b}: learned step-cost table (tokens -> s): {res['dspark+conf']['stats']['cost_table']}")
    print(f"\n{'batch':>5} {'mode':<12} {'tok/s':>8} {'vs off':>7} {'tok/step':>9} {'accept':>7} {'verified':>9} same")
    for b, m, ts, ratio, tps, acc, ver, same in rows:
        print(f"{b:>5} {m:<12} {ts:>8.1f} {ratio:>6.2f}x {tps:>9.2f} {acc:>7.2f} {ver:>9.2f} {'yes' if same else 'NO'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)


if __name__ == "__main__":
    main()
