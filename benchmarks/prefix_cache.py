"""Prefix caching on shared-prefix workloads: tokens computed and time, with and without caching.

    python benchmarks/prefix_cache.py                      # tiny generated V4.1 checkpoint, CPU (--family v4)
    python benchmarks/prefix_cache.py --model DIR --dtype bfloat16

Workloads: (1) one long system prompt + many short questions; (2) a multi-turn chat where each
turn resends the whole conversation (both: caching off, exact replay, bounded replay); (3) host tier: several long documents, questions about them
in round-robin order, under a device KV pool too small to keep more than about one document
cached, with the host-memory tier (``host_kv_cache_bytes``) off and on (prefix caching on in
both); (4) replay accuracy: many prompts sharing a system prompt, one at a time, each a prefix
hit: first-token logits and greedy tokens of exact / bounded (with and without V4.1's
decoder-side replay) / decoder replay alone, against caching off. All engines of a workload see
the same requests in the same order; "tokens fed" counts every token fed to the model (prefill,
replay and decode); "late rows" is the share of rows V4.1 computes after the decoder-replay cut.
"""
from __future__ import annotations

import argparse
import tempfile
import time

import torch


def rand(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 129000, (n,), generator=g).tolist()


# accuracy workload: short key -> (LLM keywords, printed label); "_mult": replay window = mult * W
ACCURACY_MODES = {"off": dict(enable_prefix_caching=False), "exact": dict(),
                  "bounded": dict(prefix_replay="bounded"),
                  "bounded-nodec": dict(prefix_replay="bounded", decoder_replay=False),
                  "decoder-only": dict(enable_prefix_caching=False, decoder_replay=True),
                  # longer replays (prefix_replay_window): the error shrinks as the replay covers more of the
                  # receptive field (layers x window), exact once it covers all of it
                  "replay2w": dict(prefix_replay="bounded", decoder_replay=False, _mult=2),
                  "replay4w": dict(prefix_replay="bounded", decoder_replay=False, _mult=4)}
ACCURACY_LABELS = {"off": "off", "exact": "exact", "bounded": "bounded", "bounded-nodec": "bounded, no decoder replay",
                   "decoder-only": "decoder replay only", "replay2w": "bounded, replay 2W, no dec.",
                   "replay4w": "bounded, replay 4W, no dec."}
MODES = {"off": dict(enable_prefix_caching=False), "exact": dict(),
         "bounded": dict(prefix_replay="bounded")}


def release(llm) -> None:
    """Shut ``llm`` down and give its device memory back before the next engine loads (full-width slices)."""
    import gc

    llm.llm_engine.shutdown()
    del llm
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run(model, dtype, caching: bool | str, workload: str, args, kv_bytes: int = 512 << 20, host_bytes: int = 0):
    """``caching``: True / False, or a mode name of ``MODES``."""
    from deepinfer_core import LLM, SamplingParams

    mode = MODES[caching] if isinstance(caching, str) else dict(enable_prefix_caching=caching)
    llm = LLM(model, dtype=dtype, max_model_len=4096, kv_cache_memory_bytes=kv_bytes, host_kv_cache_bytes=host_bytes,
              max_num_seqs=max(8, args.num_questions), batch_invariant=args.batch_invariant, **mode)  # fewer graph buckets to capture at start
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
    elif workload == "host-tier":
        docs = [rand(args.system_len, 300 + d) for d in range(args.num_docs)]
        for rnd in range(args.doc_rounds):  # doc 0, 1, ..., n-1, then again: each revisit finds its
            for d, doc in enumerate(docs):  # document evicted from the small device pool
                outs.append(llm.generate([doc + rand(args.question_len, 400 + 10 * d + rnd)], sp, use_tqdm=False)[0])
    else:
        conv = rand(args.system_len, 2)
        for turn in range(args.num_turns):
            conv = conv + rand(args.question_len, 200 + turn)
            out = llm.generate([conv], sp, use_tqdm=False)[0]
            conv = conv + out.outputs[0].token_ids
            outs.append(out)
    dt = time.perf_counter() - t0
    stats = eng.prefix_cache_stats()
    stats["copy_seconds"] = eng.host_store.seconds if eng.host_store is not None else 0.0
    rows = getattr(eng.model, "replay_rows", [0, 0])
    stats["late_rows"] = rows[1] / rows[0] if rows[0] else 1.0
    eng.runner.execute = orig
    del eng
    release(llm)
    return fed["n"], dt, [o.outputs[0].token_ids for o in outs], stats


def accuracy(model, dtype, args) -> None:
    """Replay accuracy: per prompt, the first token's logits and the greedy tokens of each mode vs caching off."""
    from deepinfer_core import LLM, SamplingParams

    system = rand(args.system_len, 5)
    prompts = [system + rand(args.question_len, 500 + i) for i in range(args.num_prompts)]
    sp = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    modes = {k: v for k, v in ACCURACY_MODES.items() if k == "off" or args.accuracy_modes == "all"
             or k in args.accuracy_modes.split(",")}
    res = {}
    window = None
    for name, kw in modes.items():
        kw = dict(kw)
        mult = kw.pop("_mult", 0)
        if mult:
            kw["prefix_replay_window"] = mult * window
        llm = LLM(model, dtype=dtype, max_model_len=4096, kv_cache_memory_bytes=512 << 20, async_scheduling=False,
                  max_num_seqs=4, batch_invariant=args.batch_invariant, **kw)
        window = window or llm.llm_engine.kv.replay_window
        llm.generate([system], SamplingParams(max_tokens=1), use_tqdm=False)  # warm the cache: every prompt hits
        m = llm.llm_engine.model
        first: list = []
        orig = m.compute_logits
        m.compute_logits = lambda h: first.append(orig(h)) or first[-1]
        toks, lg = [], []
        for p in prompts:
            first.clear()
            toks.append(llm.generate([p], sp, use_tqdm=False)[0].outputs[0].token_ids)
            lg.append(first[0][-1].clone())
        res[name] = (toks, torch.stack(lg), llm.llm_engine.prefix_cache_stats()["hit_tokens"])
        m.compute_logits = orig
        del m
        release(llm)
    ref_toks, ref_lg, _ = res["off"]
    top2 = ref_lg.topk(2, dim=-1).values
    print(f"replay accuracy: {len(prompts)} prompts of {args.system_len}+{args.question_len} tokens, "
          f"{args.output_len} greedy tokens; logit scale (max |logit|) {ref_lg.abs().max():.2f}, "
          f"median top-2 margin {(top2[:, 0] - top2[:, 1]).median():.3f}")
    print(f"{'mode':<28}{'hit tok':>8}{'max|dlogit|':>12}{'median':>9}{'argmax same':>12}{'all tokens same':>16}"
          f"{'tokens same':>12}")
    for key, (toks, lg, hit) in res.items():
        if key == "off":
            continue
        name = ACCURACY_LABELS[key]
        d = (lg - ref_lg).abs().max(dim=-1).values
        same_first = int((lg.argmax(-1) == ref_lg.argmax(-1)).sum())
        same_all = sum(a == b for a, b in zip(toks, ref_toks))
        agree = sum(next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a)) for a, b in zip(toks, ref_toks))
        print(f"{name:<28}{hit:>8}{d.max():>12.4f}{d.median():>9.4f}{same_first:>8}/{len(prompts):<3}"
              f"{same_all:>12}/{len(prompts):<3}{agree / sum(map(len, ref_toks)):>12.3f}")


def small_pool_bytes(model, dtype, args) -> int:
    """A device KV budget of ``--pool-docs`` times the block ids one document request occupies."""
    from deepinfer_core import LLM

    probe = LLM(model, dtype=dtype, max_model_len=4096, kv_cache_memory_bytes=64 << 20)
    specs = [s for s in probe.llm_engine.executor.specs.values() if hasattr(s, "page_bytes")]
    release(probe)
    n = args.system_len + args.question_len + args.output_len
    blocks = sum(-(-n // s.block_size) for s in {s: None for s in specs})  # one table per group
    return int(args.pool_docs * blocks) * sum(s.page_bytes for s in specs)


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
    ap.add_argument("--workloads", default="system+questions,multi-turn,host-tier,accuracy",
                    help="comma-separated subset")
    ap.add_argument("--num-prompts", type=int, default=32, help="accuracy workload: prompts (each a prefix hit)")
    ap.add_argument("--batch-invariant", action="store_true",
                    help="LLM(batch_invariant=True) everywhere: exact hits are then bit-identical to a cold run, so "
                         "what remains in the accuracy table is replay's own error, not the batch shape's")
    ap.add_argument("--accuracy-modes", default="all",
                    help=f"accuracy workload: 'all' or a comma list of {','.join(k for k in ACCURACY_MODES if k != 'off')}"
                         " (caching off always runs: it is the reference)")
    ap.add_argument("--num-docs", type=int, default=4, help="host-tier workload: documents cycled through")
    ap.add_argument("--doc-rounds", type=int, default=4, help="host-tier workload: questions per document")
    ap.add_argument("--pool-docs", type=float, default=1.5, help="host-tier workload: device pool in documents")
    ap.add_argument("--host-bytes", type=int, default=1 << 30, help="host-tier workload: host_kv_cache_bytes when on")
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
    plain = [w for w in ("system+questions", "multi-turn") if w in args.workloads.split(",")]
    if plain:
        print(f"{'workload':<18}{'mode':>8}{'tokens fed':>12}{'seconds':>9}{'hit rate':>10}{'cached blk':>11}"
              f"{'late rows':>10}{'fed off/x':>10}{'time off/x':>11}{'outputs = off':>14}")
    for workload in plain:
        rows = {}
        for mode in MODES:
            n, dt, toks, stats = run(model, args.dtype, mode, workload, args)
            rows[mode] = (n, dt, toks)
            off = rows["off"]
            same = sum(a == b for a, b in zip(toks, off[2]))
            print(f"{workload:<18}{mode:>8}{n:>12}{dt:>9.2f}{stats['hit_rate']:>10.2f}{stats['cached_blocks']:>11}"
                  f"{stats['late_rows']:>10.2f}{off[0] / n:>9.2f}x{off[1] / dt:>10.2f}x{same:>10}/{len(toks)}")
    if "accuracy" in args.workloads.split(","):
        accuracy(model, args.dtype, args)
    if "host-tier" not in args.workloads.split(","):
        return
    kv_bytes = small_pool_bytes(model, args.dtype, args)
    print(f"host-tier: {args.num_docs} documents x {args.doc_rounds} rounds, device pool {kv_bytes >> 20} MiB "
          f"({args.pool_docs} documents), host tier {args.host_bytes >> 20} MiB when on")
    print(f"{'workload':<18}{'host':>8}{'tokens fed':>12}{'seconds':>9}{'hit rate':>10}{'restored':>10}"
          f"{'spilled':>9}{'host MiB':>10}{'copy s':>8}")
    rows = {}
    for host in (False, True):
        n, dt, toks, stats = run(model, args.dtype, True, "host-tier", args, kv_bytes, args.host_bytes if host else 0)
        rows[host] = (n, dt, toks)
        print(f"{'host-tier':<18}{'on' if host else 'off':>8}{n:>12}{dt:>9.2f}{stats['hit_rate']:>10.2f}"
              f"{stats['host_blocks_restored']:>10}{stats['host_blocks_spilled']:>9}"
              f"{stats['host_bytes'] / (1 << 20):>10.1f}{stats['copy_seconds']:>8.2f}")
    print(f"{'host-tier':<18} tokens fed off/on = {rows[False][0] / rows[True][0]:.2f}x, "
          f"time off/on = {rows[False][1] / rows[True][1]:.2f}x, outputs identical: {rows[True][2] == rows[False][2]}")


if __name__ == "__main__":
    main()
