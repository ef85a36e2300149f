#!/usr/bin/env bash
# Fifty-fourth pass's device stages: OUT=dir bash pass54.sh STAGES (comma-separated; at most ~9 minutes a call).
# The issue's whole table at today's defaults on whichever Hopper card the call gets, every baseline (copy bandwidth,
# dense bf16 peak, HF eager) measured in the same run on the same card (the device tool's rule: an H100 serves for
# H200 work, timings included, with the baselines rerun there).
#   sweep    the full V4.1 sweep (decode 1, 8, 64, 256, prefill 1k and 8k; ~5 minutes): JSON + PNG + log.
#   parity   parity_tiny (greedy tokens against the CPU reference on a tiny fp32 checkpoint; bf16 logits' error ratio).
#   hf       the V4 batch-32 row (2 layers, FP8 experts) against HF transformers' eager DeepseekV4ForCausalLM in the
#            same process (the thirty-sixth pass's command; ~3 minutes).
#   b1       more V4.1 batch-1/64 readings, one process each, while the call is under B1_S (default 500) s.
# auto (the default): sweep,parity,hf,b1 (~8 minutes on an H200 with B1_S 440). Carry .whl/ (the device has no network).
# The sweep's batch-64 and 256 rows need more than an H100's 79 GiB (75.4 GB of weights): ask for kind nvidia-h200
# with needs_h200 (docs/performance_pass_54.md).
set -u
STAGES=${1:-auto}
OUT=${OUT:-.}
source "$(dirname "$0")/pass_lib.sh"  # GPU, stamp, has, quiet, auto_stages; exports; HERE
auto_stages sweep,parity,hf,b1 sweep,parity,hf,b1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv | tee "$OUT/card.txt"
if has sweep; then stamp sweep; v41_sweep; fi
if has parity; then
  stamp parity
  timeout 140 python3 -m deepinfer_nvidia.tests.parity_tiny 2>&1 | quiet | tail -12 | tee "$OUT/parity.txt"
fi
if has hf; then
  stamp "hf: the V4 batch-32 row against HF eager"
  timeout 230 python3 benchmarks/sweep.py --out "$OUT/v4_hf" --providers triton --layers 2 --decode "" --prefill "" \
    --hf-batch 32 --graphs --reps 9 --budget-s 170 --profile-decode "" 2>&1 | quiet | tee "$OUT/sweep_v4_hf.txt" \
    | grep -E "pipelined|HF|Error" | tail -8
  rm -f "$OUT"/v4_hf/*.png
fi
if has b1; then
  stamp "b1: rows"
  for r in 1 2 3 4 5 6; do
    [ $(( $(date +%s) - t0 )) -lt "${B1_S:-500}" ] && v41_row "defaults, reading $r" 1,64 DEEPINFER_PASS=54
  done | tee "$OUT/b1_rows.txt"
fi
stamp done
