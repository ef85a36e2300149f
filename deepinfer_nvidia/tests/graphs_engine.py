"""Engine decode steps replayed from CUDA graphs vs eager steps, on a CUDA device.

    python3 -m deepinfer_nvidia.tests.graphs_engine [--quick]

1. Correctness: tiny V4 (MXFP4 experts, and FP8 experts with fp32 scales: with ``--fp8-grouped`` they
   capture) and V4.1 (MXFP4 experts, mixed topology) checkpoints, fp32 and bf16 activations, 6 requests of
   different lengths (greedy and seeded top-p), 40 new tokens each, through ``LLM`` with graphs (the default
   on this platform) and with ``enforce_eager=True``:
   - batch-invariant mode: token ids and logprobs must be identical (asserted);
   - default mode: reported (padding to the bucket may move the last bits of a GEMM).
2. Speed: tiny V4.1, default mode, bf16: decode-heavy generation (prompt 32, 128 new tokens) at 1, 8 and
   64 concurrent requests, tokens/s eager vs graphs in the same process (a warm-up pass first, so the
   captures are not timed). The tiny model is host-bound, which is what graphs remove.
"""
from __future__ import annotations

import argparse
import tempfile
import time

import torch

from deepinfer_core import LLM, SamplingParams
from deepinfer_models.deepseek_v41.checkpoint_writer import tiny_v41_config, write_tiny_v41_checkpoint
from deepinfer_models.testing import write_tiny_v4_checkpoint


def prompts(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 129000, (n,), generator=g).tolist() for n in lengths]


def fingerprint(outs):
    return [(o.outputs[0].token_ids, [sorted((k, v.logprob) for k, v in d.items()) for d in o.outputs[0].logprobs])
            for o in outs]


def make_llm(path, dtype, eager, bi, max_num_seqs=8):
    from deepinfer_nvidia.platform import NvidiaPlatform

    return LLM(str(path), dtype=dtype, max_model_len=1024, max_num_seqs=max_num_seqs, batch_invariant=bi,
               kv_cache_memory_bytes=2 << 30, platform=NvidiaPlatform(), enforce_eager=eager)


def captures(g) -> str:
    """How many graphs the engine's runners captured, and their wall time (compiles included)."""
    runners = [r for r in (getattr(g, "graphed", None), getattr(g, "_graphed_draft", None)) if r is not None]
    secs = [t for r in runners for t in getattr(r, "capture_seconds", [])]
    return f"{len(secs)} captures in {sum(secs):.1f} s (longest {max(secs, default=0.0):.1f} s)"


def correctness(ckpts, dtypes) -> bool:
    ps = prompts((5, 40, 130, 300, 9, 77))
    params = [SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, logprobs=2),
              SamplingParams(temperature=0.8, top_p=0.9, seed=11, max_tokens=40, ignore_eos=True, logprobs=2)] * 3
    ok = True
    for name, path in ckpts.items():
        for dtype in dtypes:
            for bi in (True, False):
                res, cap = {}, "no graphs"
                for eager in (True, False):
                    llm = make_llm(path, dtype, eager, bi)
                    res[eager] = fingerprint(llm.generate(ps, params, use_tqdm=False))
                    g = llm.llm_engine.executor.graphs
                    steps = 0 if g is None else g.steps
                    if g is not None:
                        cap = captures(g)
                    del llm
                same = res[True] == res[False]
                tok_same = [a[0] == b[0] for a, b in zip(res[True], res[False])]
                lp = max((abs(x[1] - y[1]) for a, b in zip(res[True], res[False]) for da, db in zip(a[1], b[1])
                          for x, y in zip(da, db)), default=0.0)
                print(f"{name:5s} {dtype:8s} batch_invariant={bi!s:5} graph steps {steps:4d}: identical "
                      f"(ids+logprobs) {same}; ids per request {tok_same}; max |logprob diff| {lp:.2e}; {cap}",
                      flush=True)
                if bi and not same:
                    ok = False
                if steps == 0:
                    ok = False
    return ok


def speed(path, batches, new_tokens) -> None:
    for b in batches:
        ps = prompts([32] * b, seed=b)
        sp = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
        row = {}
        for eager in (True, False):
            llm = make_llm(path, "bfloat16", eager, False, max_num_seqs=max(b, 8))
            llm.generate(ps, sp, use_tqdm=False)  # warm-up: captures, autotuning
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            llm.generate(ps, sp, use_tqdm=False)
            torch.cuda.synchronize()
            row[eager] = b * new_tokens / (time.perf_counter() - t0)
            del llm
        print(f"speed tiny V4.1 bf16 B={b:3d}: eager {row[True]:9.0f} tok/s, graphs {row[False]:9.0f} tok/s, "
              f"graphs/eager {row[False] / row[True]:.2f}x", flush=True)


def speculative(root, batches, new_tokens) -> bool:
    """DSpark (agreeing tiny V4.1): graphed verify and draft steps run (bf16; agreement with eager reported), and
    tokens/s of {off, DSpark} x {eager, graphs} (bf16, default mode, greedy)."""
    from deepinfer_models.deepseek_v41.agreeing_checkpoint import write_agreeing_v41_checkpoint

    lang = write_agreeing_v41_checkpoint(f"{root}/agree")
    spec = {"method": "dspark", "num_speculative_tokens": 5, "confidence_scheduling": False}
    from deepinfer_nvidia.platform import NvidiaPlatform

    def llm_for(eager, bi, dtype, use_spec, seqs):
        return LLM(f"{root}/agree", dtype=dtype, max_model_len=1024, max_num_seqs=seqs, batch_invariant=bi,
                   kv_cache_memory_bytes=2 << 30, platform=NvidiaPlatform(), enforce_eager=eager,
                   speculative_config=spec if use_spec else None)

    def ps(b, n=16):
        return [{"prompt_token_ids": lang.prompt(n + i % 7, start_token=lang.tokens[(5 * i) % len(lang.tokens)])}
                for i in range(b)]

    params = SamplingParams(temperature=0.0, max_tokens=40, logprobs=1)
    res = {}
    steps = 0
    for eager in (True, False):
        # bf16, default mode: the unquantised experts run the aten grouped path (capturable); the
        # batch-invariant expert kernels for unquantised weights loop per expert (a host sync)
        llm = llm_for(eager, False, "bfloat16", True, 8)
        outs = llm.generate(ps(6), params, use_tqdm=False)
        st = llm.llm_engine.spec_decode_stats()
        g = llm.llm_engine.executor.graphs
        res[eager] = fingerprint(outs)
        steps = 0 if g is None else g.steps + g.draft_steps
        print(f"dspark bf16 eager={eager!s:5}: graph steps (verify + draft) {steps}, mean acceptance "
              f"{st['mean_acceptance_length']:.2f}{'' if g is None else '; ' + captures(g)}", flush=True)
        del llm
    same_ids = [a[0] == b[0] for a, b in zip(res[True], res[False])]
    print(f"dspark graphs vs eager (bf16, default mode, reported): ids+logprobs identical {res[True] == res[False]}, "
          f"ids per request {same_ids}", flush=True)
    ok = steps > 0
    for b in batches:
        row = {}
        for use_spec in (False, True):
            for eager in (True, False):
                llm = llm_for(eager, False, "bfloat16", use_spec, max(b, 8))
                sp = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
                llm.generate(ps(b), sp, use_tqdm=False)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                llm.generate(ps(b), sp, use_tqdm=False)
                torch.cuda.synchronize()
                row[(use_spec, eager)] = b * new_tokens / (time.perf_counter() - t0)
                del llm
        base = row[(False, False)]
        print(f"speed agreeing V4.1 bf16 B={b:3d} tok/s: off eager {row[(False, True)]:7.0f}, off graphs {base:7.0f}, "
              f"dspark eager {row[(True, True)]:7.0f}, dspark graphs {row[(True, False)]:7.0f} "
              f"(dspark graphs / off graphs {row[(True, False)] / base:.2f}x)", flush=True)
    return ok


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fp32 only, V4.1 only")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--only", default="", help="correctness,speed,spec (default: all)")
    ap.add_argument("--ckpts", default="", help="correctness on these checkpoints only: v41,v4,v4fp8 (default: all)")
    ap.add_argument("--fp8-grouped", action="store_true",
                    help="switch on triton_moe.FP8_GROUPED (capturable FP8 experts)")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    root = tempfile.mkdtemp()
    v41 = write_tiny_v41_checkpoint(f"{root}/v41", tiny_v41_config("mixed"), quant="fp4", seed=2)
    ckpts = {"v41": v41}
    if not args.quick:
        ckpts["v4"] = write_tiny_v4_checkpoint(f"{root}/v4", quant="fp4", seed=1)
        # FP8 experts with fp32 scales (the V4-Flash-Base layout): the grouped triton_moe_fp8 kernels capture
        ckpts["v4fp8"] = write_tiny_v4_checkpoint(f"{root}/v4fp8", quant="fp8", seed=3)
    if args.fp8_grouped:
        from deepinfer_nvidia.kernels import triton_moe

        triton_moe.FP8_GROUPED = True
    if args.ckpts:
        ckpts = {name: path for name, path in ckpts.items() if name in args.ckpts.split(",")}
    only = set(args.only.split(",")) if args.only else {"correctness", "speed", "spec"}
    batches = [int(b) for b in args.batches.split(",")]
    ok = True
    if "correctness" in only:
        ok = correctness(ckpts, ["float32"] if args.quick else ["float32", "bfloat16"])
    if "speed" in only:
        speed(v41, batches, args.new_tokens)
    if "spec" in only:
        ok = speculative(root, batches, args.new_tokens) and ok
    print("GRAPHS ENGINE CHECK", "PASSED" if ok else "FAILED")


if __name__ == "__main__":
    main()
