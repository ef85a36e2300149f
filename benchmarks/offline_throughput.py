"""Offline throughput: DeepInfer vs transformers' ``generate`` on the same checkpoint, prompts and batch.

    python benchmarks/offline_throughput.py                       # tiny generated V4 checkpoint, CPU
    python benchmarks/offline_throughput.py --model /path/to/ckpt --dtype bfloat16 --batch 32

Both engines get the same token-id prompts (equal lengths, so transformers needs no padding),
greedy decoding and exactly ``--output-len`` new tokens (EOS ignored). Prints a table of
generated tokens per second and the ratio DeepInfer / transformers, measured in the same run.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="native V4 checkpoint dir (default: write a tiny one)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None, help="write results here")
    ap.add_argument("--async-scheduling", choices=("on", "off"), default="on")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    from deepinfer_core import LLM, SamplingParams
    from deepinfer_core.config import parse_dtype

    model = a.model
    if model is None:
        from deepinfer_models.testing import write_tiny_v4_checkpoint

        model = tempfile.mkdtemp(prefix="deepinfer_bench_")
        write_tiny_v4_checkpoint(model, quant="none", seed=0)
    dtype = parse_dtype(a.dtype)
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, 129000, (a.batch, a.input_len), generator=g)

    rows = []
    # -- DeepInfer -----------------------------------------------------------
    llm = LLM(model, dtype=a.dtype, max_model_len=a.input_len + a.output_len + 8, max_num_seqs=max(a.batch, 1),
              max_num_batched_tokens=max(2048, a.batch * a.input_len), async_scheduling=a.async_scheduling == "on")
    sp = SamplingParams(temperature=0.0, max_tokens=a.output_len, ignore_eos=True)
    llm.generate([prompts[0, :8].tolist()], SamplingParams(max_tokens=2), use_tqdm=False)  # warm-up
    t0 = time.perf_counter()
    outs = llm.generate([p.tolist() for p in prompts], sp, use_tqdm=False)
    dt = time.perf_counter() - t0
    n = sum(len(o.outputs[0].token_ids) for o in outs)
    rows.append(("deepinfer", n, dt))
    ours_first = outs[0].outputs[0].token_ids

    # -- transformers ----------------------------------------------------------
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.oracle.hf_v4 import hf_model_from_native

    hf = hf_model_from_native(model, dtype=dtype)
    with torch.no_grad():
        hf.generate(prompts[:1, :8], max_new_tokens=2, do_sample=False)  # warm-up
        t0 = time.perf_counter()
        gen = hf.generate(prompts, max_new_tokens=a.output_len, min_new_tokens=a.output_len, do_sample=False,
                          attention_mask=torch.ones_like(prompts))
        dt = time.perf_counter() - t0
    n = (gen.shape[1] - a.input_len) * a.batch
    rows.append(("transformers", n, dt))

    print(f"\nmodel={model} dtype={a.dtype} batch={a.batch} input_len={a.input_len} output_len={a.output_len} "
          f"threads={torch.get_num_threads()} async_scheduling={a.async_scheduling}")
    print(f"{'engine':<14}{'tokens':>8}{'seconds':>10}{'tok/s':>10}")
    for name, n, dt in rows:
        print(f"{name:<14}{n:>8}{dt:>10.2f}{n / dt:>10.1f}")
    ratio = (rows[0][1] / rows[0][2]) / (rows[1][1] / rows[1][2])
    print(f"ratio deepinfer / transformers: {ratio:.2f}x")
    agree = sum(int(x == y) for x, y in zip(ours_first, gen[0, a.input_len:].tolist()))
    print(f"(greedy tokens of request 0 agreeing with transformers' cached decode: {agree}/{a.output_len})")
    if a.json:
        Path(a.json).write_text(json.dumps({"rows": rows, "ratio": ratio, "args": vars(a)}, indent=1))


if __name__ == "__main__":
    main()
