"""Engine decode step time with chained steps on and off, measured in the same run on one engine.

    python benchmarks/engine_decode.py                              # tiny generated V4 checkpoint, CPU
    DEEPINFER_ACCELERATOR=nvidia python3 benchmarks/engine_decode.py --model DIR --dtype bfloat16 \
        --batches 1,32,64 --json out.json

Per batch size B: B prompts of ``--prompt-len`` random token ids generate ``--max-tokens`` tokens (greedy, EOS
ignored), and again exactly 1 token. The engine's time per decode step is
``(t(max_tokens) - t(1)) / (max_tokens - 1)``: the prefill and the first token cancel out. Each mode
(``chain``: async scheduling with simple steps launched behind the running one, the default; ``no-chain``:
async scheduling that finishes every step before launching the next) runs ``--repeats`` times, the two
interleaved so both see the same host; medians are reported, with the ratio no-chain / chain and the share
of steps that were chained. Greedy outputs of the two modes must be identical (checked). ``--logprobs N``: every
request also asks for N top logprobs (chained steps gather them on the device). ``--profile-out DIR``: one more
chained run of the largest batch under ``torch.profiler`` (CPU, and CUDA where present), its op tables (by self
CPU time, by device time) written to ``DIR/engine_profile.txt``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import torch


def _timed_generate(llm, prompts, params) -> tuple[float, list[list[int]]]:
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - t0, [list(o.outputs[0].token_ids) for o in outs]


def _profile_run(llm, eng, prompts, params, out_dir: str) -> None:
    """One chained generate under torch.profiler; op tables to ``out_dir/engine_profile.txt``."""
    import os

    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    eng.chain_steps = True
    with profile(activities=acts) as prof:
        t, _ = _timed_generate(llm, prompts, params)
    ka = prof.key_averages()
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "engine_profile.txt"), "w") as fh:
        fh.write(f"batch {len(prompts)}, {params.max_tokens} tokens, logprobs={params.logprobs}: wall {t * 1e3:.1f} ms "
                 f"under the profiler\n\n")
        fh.write(ka.table(sort_by="self_cpu_time_total", row_limit=40, max_name_column_width=60))
        if torch.cuda.is_available():  # sorted here: table()'s device sort key differs between torch versions
            dev = sorted(((e.key, e.self_device_time_total, e.count) for e in ka if e.self_device_time_total > 0),
                         key=lambda r: -r[1])
            total = sum(r[1] for r in dev)
            fh.write(f"\n\ndevice time {total / 1e3:.1f} ms; the 30 largest (us, calls):\n")
            fh.writelines(f"{us:12.1f} {n:6d}  {name[:90]}\n" for name, us, n in dev[:30])
    print(f"profile: {os.path.join(out_dir, 'engine_profile.txt')}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="native checkpoint dir (default: write a tiny V4 one)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kv-bytes", type=int, default=1 << 30, help="KV cache budget")
    ap.add_argument("--logprobs", type=int, default=None,
                    help="every request also asks for this many top logprobs (-1: the whole vocabulary)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--profile-out", default=None, help="write torch.profiler tables of one chained run here")
    a = ap.parse_args()
    from deepinfer_core import LLM, SamplingParams

    model = a.model
    if model is None:
        from deepinfer_models.testing import write_tiny_v4_checkpoint

        model = tempfile.mkdtemp(prefix="deepinfer_engine_decode_")
        write_tiny_v4_checkpoint(model, quant="none", seed=0)
    sizes = [int(b) for b in a.batches.split(",")]
    llm = LLM(model, dtype=a.dtype, max_model_len=a.prompt_len + a.max_tokens + 8, max_num_seqs=max(sizes),
              max_num_batched_tokens=max(2048, max(sizes) * a.prompt_len), kv_cache_memory_bytes=a.kv_bytes)
    eng = llm.llm_engine
    g = torch.Generator().manual_seed(0)
    full = SamplingParams(temperature=0.0, max_tokens=a.max_tokens, ignore_eos=True, logprobs=a.logprobs)
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, logprobs=a.logprobs)
    rows = []
    for b in sizes:
        prompts = torch.randint(3, 1000, (b, a.prompt_len), generator=g).tolist()
        times: dict[str, list[float]] = {"chain": [], "no-chain": []}
        chained: dict[str, int] = {}
        outs = {}
        for rep in range(a.repeats + 1):  # the first round warms up (graph captures, autotuning)
            for mode in ("chain", "no-chain"):
                eng.chain_steps = mode == "chain"
                c0 = eng.runner.chained_steps
                t_full, outs[mode] = _timed_generate(llm, prompts, full)
                chained[mode] = eng.runner.chained_steps - c0
                t_one, _ = _timed_generate(llm, prompts, one)
                if rep:
                    times[mode].append((t_full - t_one) / (a.max_tokens - 1))
        if outs["chain"] != outs["no-chain"]:
            raise SystemExit(f"batch {b}: greedy outputs differ between chained and unchained steps")
        ms = {m: statistics.median(v) * 1e3 for m, v in times.items()}
        row = {"batch": b, "chain_ms": ms["chain"], "no_chain_ms": ms["no-chain"],
               "ratio": ms["no-chain"] / ms["chain"], "chained_steps": chained["chain"],
               "decode_steps": a.max_tokens - 1, "tok_s_chain": b / (ms["chain"] * 1e-3)}
        rows.append(row)
        print(f"batch {b:4d}: chain {ms['chain']:8.3f} ms/step   no-chain {ms['no-chain']:8.3f} ms/step   "
              f"no-chain/chain {row['ratio']:.3f}   chained {chained['chain']} of ~{a.max_tokens} steps", flush=True)
    if a.profile_out:
        _profile_run(llm, eng, torch.randint(3, 1000, (sizes[-1], a.prompt_len), generator=g).tolist(), full,
                     a.profile_out)
    print(f"\nmodel={model} dtype={a.dtype} prompt_len={a.prompt_len} max_tokens={a.max_tokens} logprobs={a.logprobs} "
          f"platform={eng.platform.device_type} graphs={eng.executor.graphs is not None}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"rows": rows, "args": vars(a)}, fh, indent=1)


if __name__ == "__main__":
    main()
