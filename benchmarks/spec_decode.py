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
online (no table given, or ``--cost-table``) and prints it.

Confidence-scheduling crossover (verify-all vs confidence, measured in the same run):

    python benchmarks/spec_decode.py --profile cost.json --sweep 1,2,4,8,16,32,64 --repeats 3

``--profile PATH`` first measures the step-time table T(R, n) on this model and platform
(``deepinfer_core/spec_decode/profile.py``: full engine steps at every verified-drafts level,
median of ``--profile-repeats``) and writes it (format: ``cost_model.py``); ``--cost-table PATH``
reuses one. ``--sweep`` then runs, per batch size, "all" (every draft verified), "conf"
(confidence_scheduling=True with the table: trims on any predicted gain) and "auto" (the
default: trims only on a predicted gain >= 5%), ``--repeats`` times interleaved, and prints the
median tok/s, the ratios to "all" and the crossover: the smallest batch from which "conf" is
at least as fast as "all" at every larger batch. The 1-minute load average is printed with each
row: on a shared machine a busy neighbour shows up there, not in the ratios' error bars.
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def build_engine(model: str, dtype: str, spec, max_num_seqs: int, batch_invariant: bool, async_scheduling: bool):
    """One engine per mode, reused for every batch size (a full-width checkpoint takes a while to load)."""
    from deepinfer_core import LLM

    return LLM(model, dtype=dtype, speculative_config=spec, max_num_seqs=max_num_seqs,
               max_num_batched_tokens=max(2048, 8 * max_num_seqs), batch_invariant=batch_invariant,
               kv_cache_memory_bytes=1 << 30, async_scheduling=async_scheduling)  # every mode gets the same pool


def run_mode(llm, prompts, max_tokens: int) -> dict:
    """Time one ``generate`` of ``prompts`` on ``llm``, after a warm-up batch of the same shapes.

    The warm-up feeds the prompts reversed (same lengths, no shared prefix block), 4 tokens each, so the
    batch's prefill shapes, first-use kernel compiles and graph captures happen before the clock starts."""
    from deepinfer_core import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    llm.generate([{"prompt_token_ids": p[::-1]} for p in prompts], SamplingParams(temperature=0, max_tokens=4,
                                                                                 ignore_eos=True), use_tqdm=False)
    eng = llm.llm_engine
    eng.reset_spec_decode_stats()
    steps = {"n": 0}
    orig = eng.runner.execute

    def counting(so):
        steps["n"] += not so.is_empty
        return orig(so)

    eng.runner.execute = counting
    try:
        t0 = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        dt = time.perf_counter() - t0
    finally:
        eng.runner.execute = orig
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"seconds": dt, "tokens": tokens, "tok_s": tokens / dt, "target_steps": steps["n"],
            "tok_per_step": tokens / steps["n"], "stats": eng.spec_decode_stats(),
            "outputs": [o.outputs[0].token_ids for o in outs]}


def _language(model_arg):
    """(model dir, synthetic language or None): the agreeing checkpoint unless --model."""
    if model_arg is not None:
        return model_arg, None
    from deepinfer_models.deepseek_v41.agreeing_checkpoint import write_agreeing_v41_checkpoint

    model = tempfile.mkdtemp(prefix="deepinfer-agree-")
    return model, write_agreeing_v41_checkpoint(model)


def _prompts(lang, b: int, prompt_len: int) -> list[list[int]]:
    if lang is not None:
        return [lang.prompt(prompt_len + i % 7, start_token=lang.tokens[i % len(lang.tokens)]) for i in range(b)]
    g = torch.Generator().manual_seed(b)
    return [torch.randint(3, 129000, (prompt_len + i % 7,), generator=g).tolist() for i in range(b)]


def _load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0]) if Path("/proc/loadavg").exists() else float("nan")


def profile_table(model: str, args, sizes: list[int], path: str) -> dict:
    """Measure T(R, n) with a confidence engine and write it to ``path``."""
    from deepinfer_core import LLM
    from deepinfer_core.spec_decode.cost_model import save_cost_table
    from deepinfer_core.spec_decode.profile import profile_step_costs

    llm = LLM(model, dtype=args.dtype, max_num_seqs=max(sizes), kv_cache_memory_bytes=1 << 30,
              max_num_batched_tokens=max(2048, 8 * max(sizes)), async_scheduling=args.async_scheduling == "on",
              speculative_config={"num_speculative_tokens": 5, "confidence_scheduling": True})
    t0 = time.perf_counter()
    table = profile_step_costs(llm.llm_engine, sizes, repeats=args.profile_repeats)
    meta = {"platform": llm.llm_engine.platform.name, "dtype": args.dtype, "threads": torch.get_num_threads(),
            "async_scheduling": args.async_scheduling, "repeats": args.profile_repeats,
            "seconds": round(time.perf_counter() - t0, 1), "load_avg_1m": _load(), "model": args.model or "agreeing"}
    save_cost_table(path, table, meta)
    llm.llm_engine.shutdown()
    print(f"profiled step-cost table in {meta['seconds']}s -> {path}")
    for r, row in table.items():
        base = row[r]
        print(f"  R={r:>3}: " + " ".join(f"{n}:{s * 1e3:.1f}ms" for n, s in row.items())
              + f"   (all drafts / none: {row[max(row)] / base:.2f}x)")
    return table


def sweep(model: str, lang, args, table_path: str) -> dict:
    """verify-all vs confidence vs auto per batch size, interleaved repeats; prints the crossover."""
    from deepinfer_core import LLM, SamplingParams

    sizes = [int(x) for x in args.sweep.split(",")]
    modes = {"all": {"confidence_scheduling": False},
             "conf": {"confidence_scheduling": True, "cost_table": table_path},
             "auto": {"confidence_scheduling": "auto", "cost_table": table_path}}
    engines = {m: LLM(model, dtype=args.dtype, max_num_seqs=max(sizes), kv_cache_memory_bytes=1 << 30,
                      max_num_batched_tokens=max(2048, 8 * max(sizes)), enable_prefix_caching=False,
                      async_scheduling=args.async_scheduling == "on",
                      speculative_config={"num_speculative_tokens": 5, **spec}) for m, spec in modes.items()}
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    for llm in engines.values():  # warm-up
        llm.generate([{"prompt_token_ids": _prompts(lang, 1, args.prompt_len)[0]}],
                     SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    runs: dict = {}
    for rep in range(args.repeats):
        for b in sizes:
            prompts = _prompts(lang, b, args.prompt_len)
            for m, llm in engines.items():
                st0 = llm.llm_engine.spec_decode_stats()
                load = _load()
                t0 = time.perf_counter()
                outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
                dt = time.perf_counter() - t0
                st1 = llm.llm_engine.spec_decode_stats()
                d = {k: st1[k] - st0[k] for k in ("num_drafts", "num_verified_tokens", "num_accepted_tokens",
                                                   "num_target_steps")}
                tokens = sum(len(o.outputs[0].token_ids) for o in outs)
                runs.setdefault((b, m), []).append({
                    "tok_s": tokens / dt, "seconds": dt, "load_avg_1m": load, **d,
                    "verified_per_step": d["num_verified_tokens"] / max(d["num_drafts"], 1),
                    "accepted_per_step": d["num_accepted_tokens"] / max(d["num_drafts"], 1),
                    "outputs": [o.outputs[0].token_ids for o in outs]})
    for llm in engines.values():
        llm.llm_engine.shutdown()
    rows = {}
    print(f"\n{'batch':>5} {'all tok/s':>10} {'conf tok/s':>11} {'conf/all':>9} {'auto tok/s':>11} {'auto/all':>9}"
          f" {'verified all/conf/auto':>23} {'accepted all/conf':>18} {'load':>5} same")
    for b in sizes:
        med = {m: statistics.median(r["tok_s"] for r in runs[(b, m)]) for m in modes}
        same = all(r["outputs"] == runs[(b, "all")][0]["outputs"] for m in modes for r in runs[(b, m)])
        ver = {m: statistics.median(r["verified_per_step"] for r in runs[(b, m)]) for m in modes}
        acc = {m: statistics.median(r["accepted_per_step"] for r in runs[(b, m)]) for m in modes}
        load = max(r["load_avg_1m"] for m in modes for r in runs[(b, m)])
        rows[b] = {"tok_s": med, "conf_over_all": med["conf"] / med["all"], "auto_over_all": med["auto"] / med["all"],
                   "verified_per_step": ver, "accepted_per_step": acc, "max_load_avg_1m": load, "same": same,
                   "runs": {m: [{k: v for k, v in r.items() if k != "outputs"} for r in runs[(b, m)]] for m in modes}}
        print(f"{b:>5} {med['all']:>10.1f} {med['conf']:>11.1f} {med['conf'] / med['all']:>8.2f}x "
              f"{med['auto']:>11.1f} {med['auto'] / med['all']:>8.2f}x "
              f"{ver['all']:>7.2f}/{ver['conf']:.2f}/{ver['auto']:.2f}       {acc['all']:>7.2f}/{acc['conf']:.2f}"
              f"{load:>10.2f} {'yes' if same else 'NO'}")
    wins = [b for i, b in enumerate(sizes) if all(rows[c]["conf_over_all"] >= 1.0 for c in sizes[i:])]
    cross = wins[0] if wins else None
    print(f"crossover: confidence scheduling >= verify-all from batch {cross} on" if cross is not None
          else "crossover: none in this range (confidence scheduling never at least as fast at the top batches)")
    return {"rows": rows, "crossover_batch": cross, "table": table_path}


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
    ap.add_argument("--async-steps", choices=("platform", "caller", "worker"), default="platform",
                    help="CPU experiment: where async steps run (the CPU platform's default is 'caller'; "
                         "'worker' is the old layout, a second OpenMP pool)")
    ap.add_argument("--profile", default=None, metavar="PATH", help="measure the step-cost table, write it here")
    ap.add_argument("--profile-repeats", type=int, default=5)
    ap.add_argument("--cost-table", default=None, metavar="PATH", help="use this step-cost table (skip --profile)")
    ap.add_argument("--sweep", default=None, metavar="B,B,..", help="verify-all vs confidence per batch size")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repeats of the sweep (median)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.async_steps != "platform":
        from deepinfer_core.platform.cpu import CpuPlatform

        CpuPlatform.steps_on_calling_thread = args.async_steps == "caller"

    model, lang = _language(args.model)
    if args.sweep or args.profile:
        table = args.cost_table
        if args.profile:
            sizes = [int(x) for x in (args.sweep or "1,2,4,8,16,32,64").split(",")]
            profile_table(model, args, sizes, args.profile)
            table = args.profile
        if args.sweep:
            if table is None:
                ap.error("--sweep needs --profile PATH or --cost-table PATH")
            out = sweep(model, lang, args, table)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(out, f, indent=1, default=str)
        return
    modes = {"off": None,
             "dspark": {"num_speculative_tokens": 5, "confidence_scheduling": False},
             "dspark+conf": {"num_speculative_tokens": 5, "confidence_scheduling": True}}
    rows, results = [], {}
    if args.cost_table:
        modes["dspark+conf"]["cost_table"] = args.cost_table
    sizes = [int(x) for x in args.batches.split(",")]
    res: dict = {b: {} for b in sizes}
    for m, spec in modes.items():  # engines in turn (one in memory at a time), each runs every batch size
        llm = build_engine(model, args.dtype, spec, max(sizes), args.batch_invariant, args.async_scheduling == "on")
        for b in sizes:
            res[b][m] = run_mode(llm, _prompts(lang, b, args.prompt_len), args.max_tokens)
        llm.llm_engine.shutdown()
        del llm
        gc.collect()
        if torch.cuda.is_available():  # the next engine needs this one's memory back
            torch.cuda.empty_cache()
            print(f"{m}: done; device memory still allocated {torch.cuda.memory_allocated() / 1e9:.2f} GB", flush=True)
    for b in sizes:
        same = all(r["outputs"] == res[b]["off"]["outputs"] for r in res[b].values())
        for m, r in res[b].items():
            st = r["stats"] or {}
            rows.append((b, m, r["tok_s"], r["tok_s"] / res[b]["off"]["tok_s"], r["tok_per_step"],
                         st.get("mean_acceptance_length", 1.0), st.get("verified_per_draft_step", 0.0), same))
            results[f"B{b}/{m}"] = {k: v for k, v in r.items() if k != "outputs"}
        if res[b]["dspark+conf"]["stats"]:
            print(f"B={b}: step-cost table (R -> tokens -> s): {res[b]['dspark+conf']['stats']['cost_table']}")
    print(f"\n{'batch':>5} {'mode':<12} {'tok/s':>8} {'vs off':>7} {'tok/step':>9} {'accept':>7} {'verified':>9} same")
    for b, m, ts, ratio, tps, acc, ver, same in rows:
        print(f"{b:>5} {m:<12} {ts:>8.1f} {ratio:>6.2f}x {tps:>9.2f} {acc:>7.2f} {ver:>9.2f} {'yes' if same else 'NO'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)


if __name__ == "__main__":
    main()
