"""Decode / prefill sweep of a full-width DeepSeek-V4 or V4.1 slice on one GPU, against the roofline.

    python benchmarks/sweep.py --out DIR [--arch v4|v41] [--layers 2] [--ratios 4,128]
        [--decode 1,8,64,256] [--context 4096] [--prefill 1024,8192] [--providers triton,reference]
        [--hf-batch 32] [--budget-s 400] [--graphs] [--moe-tune moe_tune.json] [--sync-audit] [--reps 5]
        [--save-checkpoint DIR [--save-only]] [--engram-vocab 1048576]

What it builds: the real V4-Flash widths (hidden 4096, 64 heads x 512, q_lora 1024,
256 experts top-6, moe_inter 2048, vocab 129280) with ``--layers`` layers whose
compress ratios are ``--ratios`` (layer 0 a hash-routed MoE layer), random weights
in the native layout (e4m3 + UE8M0 128x128 block scales for the dense linears,
MXFP4 experts: the ``fp4`` preset of the checkpoint writer) generated directly
on the GPU (the CPU writer would spend minutes quantising 768 experts per layer).

``--arch v41``: the V4.1-Flash widths (hidden 5120, 64 heads x 512, q_lora 1280, 384 experts
top-6, moe_inter 2304, vocab 129280, 32x32 UE8M0 FP8 blocks, MXFP4 experts) with one layer of
each of its layer kinds by default (``--layers 8``: ratio 0, ratio 0 + Engram, the ratio-2 kv +
index source, a ratio-2 consumer, a ratio-2 index-only source + Engram, the ratio-1 kv + index +
candidate source, a ratio-1 consumer, a candidate-masked ratio-1 index source; ``--ratios`` is
ignored), Engram tables of ``--engram-vocab``-based size, and its own byte / FLOP accounting
(Engram rows and ``wkv``, mHC, compressors and indexers per layer kind, the candidate filter):
``benchmarks/sweep_slice_v41.py`` says what each column counts. No HF peer for V4.1
(transformers has V4 only). ``--save-checkpoint DIR`` writes the slice (with the DSpark
``mtp.{0,1,2}`` stages) as a native checkpoint that ``LLM(DIR)``, ``benchmarks/spec_decode.py
--model DIR`` and ``benchmarks/prefix_cache.py --model DIR`` load; ``--save-only`` stops there.

What it measures, per provider (``triton`` = the nvidia platform's default kernels, exactly as the engine
resolves them: Triton, then the ``aten`` grouped-GEMM experts and cuBLAS; ``reference`` = core's
torch references on the same GPU), through ``PagedExecutor`` (metadata built on
the CPU every step, as the engine does):
- decode: one token for each of B requests whose caches already hold
  ``--context`` tokens (cache contents random, so no prefill is needed), logits
  included;
- prefill: one request of L tokens, logits of the last token.
Each row: median step time, tokens/s, the roofline time (bytes the step must
read at least: native-layout weights actually touched, routed experts counted by
the expected number of distinct experts for B*6 uniform picks, plus the KV rows
attention and the indexer read; over the copy bandwidth measured in this run),
and for prefill the fraction of the dense bf16 peak measured in this run.
Also: HF transformers' eager ``DeepseekV4ForCausalLM`` (bf16, same slice) decode
at ``--hf-batch`` as the peer, and a torch-profiler table of one triton decode
step and one prefill step (with kernel-launch counts). Writes ``sweep.json``,
``sweep.png``, ``profile.txt``.

``--graphs``: every triton decode config is measured a second time (provider
``triton+graphs``) with the whole model step replayed from a CUDA graph, exactly as
the engine does it (``deepinfer_core/runner/decode_graphs.py``: the step is padded
to its batch/context bucket, its metadata packed into one tensor, and the graph
captured by ``deepinfer_nvidia.graphs.CudaGraphRunner`` replayed); the logits GEMM
stays outside. ``--sync-audit`` lists every host synchronisation of one decode step
(``torch.cuda.set_sync_debug_mode``).
The graphed step's final hidden states are compared with the eager ones (bitwise, and the max
difference: the graph reads a context bucket wider than the step's own), and eager and
graphed steps are also timed alternately (``paired_*_ms``), since the host's speed drifts between
measurements taken seconds apart. ``pipelined_ms``: the same graphed steps chained on the device (each
step's ids are the previous step's greedy samples, never read by the host), so the host packs step N+1
while the device runs step N, as the engine's pipelined decode does (``benchmarks/sweep_timing.py``).
``--moe-tune FILE``: apply ``moe_tune.json`` from ``deepinfer_nvidia.tests.bench_moe``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from deepinfer_core.runner.context import SeqSlice  # noqa: E402
from deepinfer_core.runner.executor import PagedExecutor  # noqa: E402
from deepinfer_core.runner.simple_driver import SimpleBlockAllocator  # noqa: E402
from deepinfer_models.deepseek_v4.config import DeepseekV4Config  # noqa: E402
from benchmarks.sweep_timing import profile_step, sync_audit, time_ab, time_pipelined, time_step  # noqa: E402
from benchmarks.sweep_slice import (  # noqa: E402
    arch_config, build_weights, describe, kv_bytes, model_class, native_bytes, prefill_flops, weight_bytes)
from deepinfer_models.deepseek_v4.checkpoint_writer import QUANT_PRESETS  # noqa: E402

T0 = time.time()

DEV = "cuda"


def sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:7.1f}s] {msg}", flush=True)


# -- ceilings ------------------------------------------------------------------------------------
def ceilings() -> dict[str, float]:
    if DEV != "cuda":  # smoke runs on the CPU: rough numbers, only so the arithmetic runs
        a = torch.randn(16 << 20)
        t0 = time.perf_counter()
        a.clone()
        bw = 2 * a.numel() * 4 / (time.perf_counter() - t0)
        x = torch.randn(512, 512)
        t0 = time.perf_counter()
        x @ x
        return {"copy_bw": bw, "bf16_peak": 2 * 512 ** 3 / (time.perf_counter() - t0)}
    from triton.testing import do_bench

    a = torch.randn(512 << 20, device="cuda")
    b = torch.empty_like(a)
    ms = do_bench(lambda: b.copy_(a), warmup=50, rep=300, return_mode="median")
    bw = 2 * a.numel() * 4 / (ms * 1e-3)
    del a, b
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = do_bench(lambda: x @ y, warmup=50, rep=300, return_mode="median")
    peak = 2 * 8192 ** 3 / (ms * 1e-3)
    del x, y
    torch.cuda.empty_cache()
    return {"copy_bw": bw, "bf16_peak": peak}


# -- running ---------------------------------------------------------------------------------------
_PLATFORMS: dict[str, object] = {}


def nvidia_platform(provider: str):
    """One ``NvidiaPlatform`` a provider ("triton" or "bi"), shared by its model, step kernels and graph runner:
    the platform compiles graphed steps (``DEEPINFER_NV_COMPILE=1``) only when every kernel resolved through
    that instance is opaque, so a fresh instance for the graph runner never compiled (H200, pass29a)."""
    from deepinfer_nvidia.platform import NvidiaPlatform

    if provider not in _PLATFORMS:
        _PLATFORMS[provider] = NvidiaPlatform()
    return _PLATFORMS[provider]


def make_model(cfg, weights, provider: str):
    """The slice's model class (V4 or V4.1: ``model_class``; V4.1 also gets its Engram token map)."""
    cls, extra = model_class(cfg)
    if provider == "reference":
        return cls(cfg, weights, dtype=torch.bfloat16, device=DEV, platform=None, **extra)
    platform = nvidia_platform(provider)
    if provider == "bi":  # batch-invariant mode: only providers registered batch_invariant=True, else references
        from deepinfer_core.kernels.mode import kernel_mode

        with kernel_mode(batch_invariant=True):
            return cls(cfg, weights, dtype=torch.bfloat16, device="cuda", platform=platform, **extra)
    return cls(cfg, weights, dtype=torch.bfloat16, device="cuda", platform=platform, **extra)


def step_kernels(provider: str) -> dict | None:
    """The step-metadata kernels (``kv.sliding_slots`` / ``kv.compressed_slots``) the engine resolves for this
    provider (``LLMEngine`` hands them to its executor); None (core's torch ops) for the references."""
    if provider == "reference":
        return None
    from deepinfer_core.kernels.mode import kernel_mode
    from deepinfer_core.kernels.resolve import resolve_kernels
    from deepinfer_core.runner.executor import STEP_KERNEL_OPS

    with kernel_mode(batch_invariant=provider == "bi"):
        return resolve_kernels(STEP_KERNEL_OPS, nvidia_platform(provider))


def setup_step(model, cfg, batch: int, ctx: int, new_tokens: int, kernels: dict | None = None):
    """An executor whose caches look like ``batch`` requests that already hold ``ctx`` tokens; ``kernels``:
    its step-metadata kernels (``step_kernels(provider)``, as the engine passes them)."""
    specs = model.kv_cache_specs()
    from deepinfer_core.runner.executor import group_specs

    gspecs, _, _ = group_specs(specs)
    need = sum(batch * -(-(ctx + new_tokens) // s.block_size) for s in gspecs.values()) + 2
    ex = PagedExecutor(model, num_blocks=need, max_num_seqs=batch, device=DEV, kernels=kernels)
    for t in ex.caches.values():
        if t.is_floating_point():
            t.normal_()
        else:  # V4.1's Engram history: token ids
            t.random_(0, cfg.vocab_size)
    alloc = SimpleBlockAllocator(ex)
    slices = [SeqSlice(ctx, new_tokens, alloc.tables_for(i, ctx + new_tokens), state_slot=i) for i in range(batch)]
    ids = torch.randint(0, cfg.vocab_size, (batch * new_tokens,), device=DEV)
    return ex, slices, ids


def graph_steps(ex, batch: int, ctx: int, provider: str = "triton"):
    """Whole decode steps replayed from CUDA graphs, as the engine runs them: ``ex.graphs`` pads the
    step to its bucket and replays the graph captured for it (``deepinfer_core/runner/decode_graphs.py``
    over ``deepinfer_nvidia.graphs.CudaGraphRunner``, from the provider's platform: ``nvidia_platform``)."""
    from deepinfer_core.runner.decode_graphs import DecodeGraphs

    return DecodeGraphs(ex, nvidia_platform(provider).graph_runner, (batch,), max_context=ctx + 2)


def run_hf(cfg: DeepseekV4Config, batch: int, prompt: int, results: dict) -> None:
    """HF transformers eager DeepseekV4ForCausalLM, bf16 random weights, decode time per step."""
    try:
        import transformers
        from transformers import DeepseekV4ForCausalLM as HF

        from tests.oracle.hf_v4 import hf_config_from_native
    except Exception as exc:  # noqa: BLE001 - recorded, not fatal
        results["hf"] = {"error": f"{type(exc).__name__}: {exc}"}
        log(f"HF peer unavailable: {exc}")
        return
    hcfg = hf_config_from_native(dataclasses.replace(cfg, quant=QUANT_PRESETS["none"]))
    hcfg._attn_implementation = "eager"
    hcfg.use_cache = True
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(DEV):
            model = HF(hcfg).eval()
    finally:
        torch.set_default_dtype(old)
    ids = torch.randint(0, cfg.vocab_size, (batch, prompt), device=DEV)

    def gen(n):
        sync()
        t0 = time.perf_counter()
        with torch.inference_mode():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                           do_sample=False, pad_token_id=0)
        sync()
        return time.perf_counter() - t0

    try:
        gen(2)
        a, b = gen(2), gen(10)
        step = (b - a) / 8
        results["hf"] = {"version": transformers.__version__, "batch": batch, "prompt": prompt,
                         "decode_ms": step * 1e3, "tok_s": batch / step, "prefill_plus_2_ms": a * 1e3}
        log(f"HF eager: batch {batch} decode {step * 1e3:.1f} ms/step, {batch / step:.0f} tok/s")
    except Exception as exc:  # noqa: BLE001
        results["hf"] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        log(f"HF peer failed: {exc}")
    del model
    if DEV == "cuda":
        torch.cuda.empty_cache()


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in results["rows"] if "ms" in r]
    labels = sorted({r["label"] for r in rows}, key=lambda s: (s.split()[0], int(s.split()[1].split("=")[1])))
    provs = sorted({r["provider"] for r in rows})
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(labels)), 4.5))
    width = 0.8 / (len(provs) + 1)
    for j, p in enumerate(provs):
        ys = [next((r["ms"] for r in rows if r["label"] == lab and r["provider"] == p), float("nan")) for lab in labels]
        ax.bar([i + j * width for i in range(len(labels))], ys, width, label=p)
    roof = [next((r["roofline_ms"] for r in rows if r["label"] == lab), float("nan")) for lab in labels]
    ax.bar([i + len(provs) * width for i in range(len(labels))], roof, width, label="roofline (bytes / copy BW)")
    ax.set_yscale("log")
    ax.set_ylabel("ms per step")
    ax.set_xticks([i + width for i in range(len(labels))])
    ax.set_xticklabels(labels, rotation=20)
    arch = {"v4": "V4", "v41": "V4.1"}.get(results["config"]["arch"], results["config"]["arch"])
    ax.set_title(f"DeepSeek-{arch} slice, {results['config']['layers']} layers, {results.get('device', '')}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--arch", default="v4")
    ap.add_argument("--layers", type=int, default=None, help="default: 2 for v4, 8 (one of each kind) for v41")
    ap.add_argument("--ratios", default="4,128")
    ap.add_argument("--quant", default="fp4", choices=sorted(QUANT_PRESETS))
    ap.add_argument("--decode", default="1,8,64,256")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--prefill", default="1024,8192")
    ap.add_argument("--providers", default="triton,reference")
    ap.add_argument("--reference-max-batch", type=int, default=64)
    ap.add_argument("--reference-max-prefill", type=int, default=1024)
    ap.add_argument("--hf-batch", type=int, default=32)
    ap.add_argument("--hf-prompt", type=int, default=128)
    ap.add_argument("--device", default="cuda", help="cuda; cpu only for a smoke run of the script (--tiny)")
    ap.add_argument("--tiny", action="store_true", help="tiny widths (the test checkpoint's), for smoke runs")
    ap.add_argument("--budget-s", type=float, default=400.0, help="stop starting new measurements after this")
    ap.add_argument("--graphs", action="store_true", help="also time triton decode with CUDA-graphed MoE FFNs")
    ap.add_argument("--sync-audit", action="store_true", help="list the host syncs of one triton decode step")
    ap.add_argument("--moe-tune", default="", help="moe_tune.json from deepinfer_nvidia.tests.bench_moe")
    ap.add_argument("--profile-decode", default="1,64", help="decode batch sizes to profile (triton)")
    ap.add_argument("--skip-hf", action="store_true", help="measure the --hf-batch config but not the HF peer")
    ap.add_argument("--reps", type=int, default=5, help="timed steps per triton config (median reported)")
    ap.add_argument("--save-checkpoint", default="", help="v41: also write the slice (with mtp.*) as a checkpoint")
    ap.add_argument("--save-only", action="store_true", help="with --save-checkpoint: write it and stop")
    ap.add_argument("--no-draft", action="store_true",
                    help="with --save-checkpoint: a target-only checkpoint (no mtp.*: 3 fewer MoE layers on disk)")
    ap.add_argument("--engram-vocab", type=int, default=1 << 20,
                    help="v41: engram_vocab_size (table rows ~ 24x this; the real ~16M gives 98 GB tables)")
    args = ap.parse_args()
    global DEV
    DEV = args.device
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.save_checkpoint and args.arch != "v41":
        raise SystemExit("--save-checkpoint: only --arch v41 (V4 has deepinfer_models.deepseek_v4.checkpoint_writer)")
    if args.arch == "v41" and args.ratios != ap.get_default("ratios"):
        log("--ratios is ignored for --arch v41: the layer kinds fix every ratio (sweep_slice_v41.py)")
    cfg = arch_config(args.arch, args.layers, [int(r) for r in args.ratios.split(",")], args.quant, tiny=args.tiny,
                      engram_vocab=args.engram_vocab)
    results: dict = {"config": {"arch": args.arch, "layers": cfg.num_hidden_layers,
                                "ratios": list(cfg.compress_ratios), "quant": args.quant, "context": args.context,
                                "hidden": cfg.hidden_size, "heads": cfg.num_attention_heads,
                                "head_dim": cfg.head_dim, "experts": cfg.n_routed_experts,
                                "top_k": cfg.num_experts_per_tok, "vocab": cfg.vocab_size, **describe(cfg)},
                     "device": torch.cuda.get_device_name() if DEV == "cuda" else "cpu", "torch": torch.__version__, "rows": []}
    if args.moe_tune and not os.path.exists(args.moe_tune):
        log(f"--moe-tune {args.moe_tune}: no such file; the defaults of triton_moe stay")
    elif args.moe_tune:
        import deepinfer_nvidia.kernels.triton_moe as tm

        tune = json.load(open(args.moe_tune))
        tm.TUNE.update({int(k): tuple(v) for k, v in tune["tune"].items()})
        if tune.get("dequant_pairs") is not None:  # None: the bench measured no prefill-sized row
            tm.DEQUANT_PAIRS = int(tune["dequant_pairs"])
        tm.DEQUANT_INT = int(tune.get("dequant_int", tm.DEQUANT_INT))
        import deepinfer_nvidia.kernels.triton_moe_segments as sg
        import deepinfer_nvidia.kernels.triton_moe_splitk as sk

        if tune.get("splitk_pairs"):  # the small-batch paths' measured range (per-pair or segments)
            sk.SPLITK_PAIRS = int(tune["splitk_pairs"])
        sg.SEG_R = int(tune.get("seg_r", sg.SEG_R))
        sg.SEG_MIN_PAIRS = int(tune.get("seg_min_pairs", sg.SEG_MIN_PAIRS)) or sg.SEG_MIN_PAIRS
        results["moe_tune"] = {"tune": {str(k): v for k, v in tm.TUNE.items()}, "dequant_pairs": tm.DEQUANT_PAIRS,
                               "dequant_int": tm.DEQUANT_INT, "splitk_pairs": sk.SPLITK_PAIRS, "seg_r": sg.SEG_R,
                               "seg_min_pairs": sg.SEG_MIN_PAIRS}
        log(f"moe tune applied: {results['moe_tune']}")
    results.update(ceilings())
    log(f"copy {results['copy_bw'] / 1e12:.2f} TB/s, bf16 dense {results['bf16_peak'] / 1e12:.0f} TFLOP/s")
    weights = build_weights(cfg, DEV, draft=bool(args.save_checkpoint) and not args.no_draft)
    sync()
    log(f"weights built: {native_bytes(weights) / 1e9:.1f} GB native")
    if args.save_checkpoint:
        from benchmarks.sweep_slice_v41 import save_checkpoint

        t_save = time.time()
        path = save_checkpoint(weights, args.save_checkpoint)
        results["checkpoint"] = {"path": str(path), "gb": native_bytes(weights) / 1e9, "s": time.time() - t_save}
        log(f"checkpoint written to {path} in {time.time() - t_save:.0f} s (LLM({str(path)!r}) loads it)")
        if args.save_only:
            return

    def save():
        with open(out / "sweep.json", "w") as fh:
            json.dump(results, fh, indent=1)

    prof_fh = open(out / "profile.txt", "w")
    decode = [int(b) for b in args.decode.split(",") if b]
    prof_decode = {int(b) for b in args.profile_decode.split(",") if b}
    prefill = [int(p) for p in args.prefill.split(",") if p]
    for provider in args.providers.split(","):
        model = make_model(cfg, weights, provider)
        kernels = step_kernels(provider)
        sync()
        mem = torch.cuda.memory_allocated() / 1e9 if DEV == "cuda" else 0.0
        log(f"model built for provider {provider}; GPU memory {mem:.1f} GB")
        configs = [("decode", b, args.context) for b in decode]
        if provider == "triton" and args.hf_batch not in decode:
            configs.append(("decode", args.hf_batch, args.hf_prompt))
        configs += [("prefill", L, 0) for L in prefill]
        for kind, n, ctx in configs:
            if provider == "reference" and ((kind == "decode" and n > args.reference_max_batch)
                                            or (kind == "prefill" and n > args.reference_max_prefill)):
                continue
            if time.time() - T0 > args.budget_s:
                log(f"budget reached; skipping {provider} {kind} {n}")
                results["rows"].append({"provider": provider, "kind": kind, "n": n, "skipped": "budget"})
                continue
            label = f"decode B={n}" + (f" ctx={ctx}" if ctx != args.context else "") if kind == "decode" \
                else f"prefill L={n}"
            try:
                batch, new = (n, 1) if kind == "decode" else (1, n)
                ex, slices, ids = setup_step(model, cfg, batch, ctx, new, kernels)
                slow = provider == "reference"
                m = time_step(model, ex, slices, ids, kind == "prefill", warmup=1 if slow else 2,
                              reps=2 if slow else args.reps)
            except torch.OutOfMemoryError as exc:  # recorded; the next config may still fit
                results["rows"].append({"provider": provider, "kind": kind, "n": n, "error": f"OOM: {exc}"[:300]})
                log(f"{provider} {label}: OOM")
                if DEV == "cuda":
                    torch.cuda.empty_cache()
                continue
            tokens = n
            wb = weight_bytes(weights, cfg, tokens)
            kvb = kv_bytes(cfg, n, ctx) if kind == "decode" else 0.0
            roof_bytes = wb["dense"] + wb["experts"] + kvb
            row = {"provider": provider, "kind": kind, "n": n, "context": ctx, "label": label, **m,
                   "tok_s": tokens / (m["ms"] * 1e-3), "bytes": roof_bytes, "kv_bytes": kvb,
                   "distinct_experts": wb["distinct_experts"],
                   "roofline_ms": roof_bytes / results["copy_bw"] * 1e3}
            row["x_roofline"] = row["ms"] / row["roofline_ms"]
            if kind == "prefill":
                fl = prefill_flops(weights, cfg, n)
                row["flops"] = fl
                row["frac_peak"] = fl / (m["ms"] * 1e-3) / results["bf16_peak"]
            results["rows"].append(row)
            save()
            extra = f", {row['frac_peak'] * 100:.1f}% of bf16 peak" if kind == "prefill" else ""
            log(f"{provider:9s} {label:22s} {m['ms']:9.2f} ms (meta {m['metadata_ms']:.2f}) "
                f"{row['tok_s']:10.0f} tok/s  roofline {row['roofline_ms']:.3f} ms  x{row['x_roofline']:.1f}{extra}")
            profiled = provider == "triton" and ((kind == "decode" and n in prof_decode and ctx == args.context)
                                                 or (kind == "prefill" and n == prefill[0]))
            if profiled:
                try:
                    row["profile"] = profile_step(model, ex, slices, ids, kind == "prefill", f"{provider} {label}",
                                                  prof_fh)
                except Exception as exc:  # noqa: BLE001 - the profile is a diagnostic
                    log(f"profiler failed: {exc}")
            if provider == "triton" and kind == "decode" and args.sync_audit and "sync_audit" not in results:
                try:
                    results["sync_audit"] = {"config": label, **sync_audit(model, ex, slices, ids)}
                    log(f"sync audit ({label}): {results['sync_audit']['total']} host syncs: "
                        f"{results['sync_audit']['where']}")
                except Exception as exc:  # noqa: BLE001
                    results["sync_audit"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                    log(f"sync audit failed: {exc}")
            if provider == "triton" and kind == "decode" and args.graphs:
                with torch.inference_mode():
                    eager_h = ex.run(ids, slices).clone()
                try:
                    graphs = graph_steps(ex, n, ctx)
                    ex.graphs = graphs
                    t_cap = time.perf_counter()
                    with torch.inference_mode():
                        ex.run(ids, slices)  # capture (warm up, record, replay)
                    sync()
                    t_cap = time.perf_counter() - t_cap
                    with torch.inference_mode():
                        graph_h = ex.run(ids, slices).clone()  # replay
                    same = bool(torch.equal(eager_h, graph_h))
                    diff = float((eager_h.float() - graph_h.float()).abs().max())
                    gm = time_step(model, ex, slices, ids, False, warmup=2, reps=args.reps)
                    with torch.inference_mode():
                        gm.update(time_ab(model, ex, slices, ids, graphs, args.reps))
                    gm.update(time_pipelined(model, ex, slices, ids))
                    grow = {**row, **gm, "provider": "triton+graphs", "graph_bit_identical": same,
                            "graph_max_abs_diff": diff, "capture_s": t_cap,
                            "tok_s": tokens / (gm["ms"] * 1e-3), "x_roofline": gm["ms"] / row["roofline_ms"],
                            "x_roofline_pipelined": gm["pipelined_ms"] / row["roofline_ms"]}
                    grow.pop("profile", None)
                    if n in prof_decode and ctx == args.context:
                        grow["profile"] = profile_step(model, ex, slices, ids, False, f"triton+graphs {label}",
                                                       prof_fh)
                    results["rows"].append(grow)
                    save()
                    log(f"{'+graphs':9s} {label:22s} {gm['ms']:9.2f} ms (meta {gm['metadata_ms']:.2f}) "
                        f"x{grow['x_roofline']:.1f}  capture {t_cap:.1f} s, bit-identical to eager: {same} "
                        f"(max diff {diff:.2e}); alternated eager/graphs "
                        f"{gm['paired_eager_ms']:.2f} / {gm['paired_graphs_ms']:.2f} ms; pipelined "
                        f"{gm['pipelined_ms']:.2f} ms (x{grow['x_roofline_pipelined']:.2f})")
                except Exception as exc:  # noqa: BLE001 - recorded; eager numbers stand
                    results["rows"].append({"provider": "triton+graphs", "kind": kind, "n": n,
                                            "error": f"{type(exc).__name__}: {exc}"[:400]})
                    log(f"graphs failed for {label}: {type(exc).__name__}: {exc}")
                finally:
                    ex.graphs = None
            del ex, slices, ids
            if DEV == "cuda":
                torch.cuda.empty_cache()
        del model
        if DEV == "cuda":
            torch.cuda.empty_cache()
    prof_fh.close()
    del weights
    if DEV == "cuda":
        torch.cuda.empty_cache()
    if args.arch == "v41" and args.hf_batch and not args.skip_hf:
        results["hf"] = {"skipped": "transformers implements DeepseekV4ForCausalLM only; V4.1 has no HF peer"}
        log("HF peer skipped: transformers has no DeepSeek-V4.1 (no Engram, delayed mHC, ratio-1/2 compressors)")
    elif args.hf_batch and not args.skip_hf and time.time() - T0 < args.budget_s + 60:
        run_hf(cfg, args.hf_batch, args.hf_prompt, results)
        for provider, key, field in (("triton", "speedup_triton", "ms"), ("triton+graphs", "speedup_graphs", "ms"),
                                     ("triton+graphs", "speedup_pipelined", "pipelined_ms")):
            ours = next((r for r in results["rows"] if r.get("provider") == provider and r.get("kind") == "decode"
                         and r.get("n") == args.hf_batch and field in r and r.get("context") == args.hf_prompt), None)
            if ours and "decode_ms" in results.get("hf", {}):
                results["hf"][key] = results["hf"]["decode_ms"] / ours[field]
    save()
    try:
        plot(results, str(out / "sweep.png"))
    except Exception as exc:  # noqa: BLE001
        log(f"plot failed: {exc}")
    # -- the table, last -------------------------------------------------------------------------
    print(f"\n{results['device']}  copy {results['copy_bw'] / 1e12:.2f} TB/s  bf16 {results['bf16_peak'] / 1e12:.0f} "
          f"TFLOP/s  layers={cfg.num_hidden_layers} ratios={list(cfg.compress_ratios)} ctx={args.context}")
    print(f"{'provider':10s} {'config':24s} {'ms/step':>9s} {'meta ms':>8s} {'tok/s':>10s} {'roof ms':>8s} "
          f"{'x roof':>7s} {'%peak':>6s}")
    for r in results["rows"]:
        if "ms" not in r:
            print(f"{r['provider']:10s} {r['kind']} {r['n']}: {r.get('skipped') or r.get('error')}")
            continue
        pk = f"{r['frac_peak'] * 100:5.1f}" if "frac_peak" in r else "     -"
        print(f"{r['provider']:10s} {r['label']:24s} {r['ms']:9.2f} {r['metadata_ms']:8.2f} {r['tok_s']:10.0f} "
              f"{r['roofline_ms']:8.3f} {r['x_roofline']:7.1f} {pk}")
    if "hf" in results:
        print("HF peer:", json.dumps(results["hf"]))


if __name__ == "__main__":
    main()
