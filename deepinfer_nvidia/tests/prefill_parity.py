"""Prefill of a full-width V4.1 slice: the nvidia kernels against core's references, last-token logits (sixteenth
pass; not a pytest file: it builds ~20 GB of weights).

    python3 -m deepinfer_nvidia.tests.prefill_parity [--out DIR] [--layers 4] [--tokens 300,1100]
    python3 -m deepinfer_nvidia.tests.prefill_parity --device cpu --tiny --tokens 40   # smoke run

The kernel tests check each op alone. This checks the ops together, in a model whose prefill takes the
prefill-only launches: from 512 rows the attention launch with 64-slot chunks, and from 1024 rows the mHC
projection in bf16 pieces. The sweep's slice (``benchmarks/sweep_slice.py``, random weights in the native FP8 /
MXFP4 layout) runs one prefill of each ``--tokens`` length, same ids, once with the platform's default providers
and once with every op on its torch reference (both bf16 on the same device).

For each length it prints the relative max error of the last token's logits, their cosine similarity and whether
the greedy token agrees. A length below the prefill thresholds (300 tokens) shows how far the two stacks drift on
the decode-sized launches alone, so the long lengths are read against it. The run fails (exit 1) when a length's
cosine is below 0.999 or its greedy token differs. Writes ``prefill_parity.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--tokens", default="300,1100")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="the test checkpoint's widths (smoke runs on the CPU)")
    args = ap.parse_args()
    from benchmarks import sweep
    from benchmarks.sweep_slice import arch_config, build_weights

    sweep.DEV = args.device
    cfg = arch_config("v41", args.layers, [0], "fp4", tiny=args.tiny, engram_vocab=1 << (10 if args.tiny else 16))
    weights = build_weights(cfg, args.device)
    lengths = [int(v) for v in args.tokens.split(",")]
    logits: dict[str, dict[int, torch.Tensor]] = {}
    # on the CPU (smoke runs) both sides are the references: the script runs, the numbers are trivially equal
    for side, provider in (("fast", "triton" if args.device == "cuda" else "reference"), ("ref", "reference")):
        model = sweep.make_model(cfg, weights, provider)
        out = logits.setdefault(side, {})
        for n in lengths:
            torch.manual_seed(n)  # the same ids (and cache fill) for both providers
            ex, slices, ids = sweep.setup_step(model, cfg, 1, 0, n, sweep.step_kernels(provider))
            with torch.inference_mode():
                out[n] = model.compute_logits(ex.run(ids, slices)[-1:]).float().cpu()[0]
            del ex
        del model
        if args.device == "cuda":
            torch.cuda.empty_cache()
    fast, ref, rows, failed = logits["fast"], logits["ref"], [], False
    for n in lengths:
        a, b = fast[n], ref[n]
        rel = ((a - b).abs().max() / b.abs().max()).item()
        cos = torch.nn.functional.cosine_similarity(a, b, dim=0).item()
        same = int(a.argmax()) == int(b.argmax())
        ok = cos >= 0.999 and same
        failed |= not ok
        rows.append({"tokens": n, "rel_max_err": rel, "cosine": cos, "greedy_equal": same})
        print(f"prefill {n:5d} tokens: last-token logits rel max err {rel:.2e}, cosine {cos:.6f}, "
              f"greedy {'equal' if same else 'DIFFERS'}{'' if ok else '  FAIL'}", flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "prefill_parity.json").write_text(json.dumps({"layers": args.layers, "rows": rows}, indent=1))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
