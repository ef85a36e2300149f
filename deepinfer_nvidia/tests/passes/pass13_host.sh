#!/usr/bin/env bash
# The thirteenth pass's host-side check (group-level table reuse): OUT=dir bash deepinfer_nvidia/tests/passes/pass13_host.sh
# 1. the V4.1 sweep's decode rows (graphs) at batch 64, 1 and 8, no prefill;
# 2. host_breakdown of the graphed batch-64 step (its host pieces, each timed).
set -u
OUT=${OUT:-.}
export PYTHONUNBUFFERED=1 DEEPINFER_ACCELERATOR=nvidia DEEPINFER_NV_SWAP_PAIRS=${DEEPINFER_NV_SWAP_PAIRS:-1,98304}
t0=$(date +%s)
timeout "${V41_S:-150}" python3 benchmarks/sweep.py --arch v41 --out "$OUT/v41" --providers triton \
  --decode 64,1,8 --prefill "" --hf-batch 64 --skip-hf --graphs --reps 15 --budget-s 120 --profile-decode 64 2>&1 \
  | tee "$OUT/sweep_v41.txt" | grep -vE "Warning|warn" | grep -E "graphs|alternated|copy" | tail -8
echo "[$(( $(date +%s) - t0 )) s] host breakdown"
timeout "${HB_S:-90}" python3 -m deepinfer_nvidia.tests.host_breakdown --out "$OUT/hb" --batches 64 --skip-synthetic \
  2>&1 | tee "$OUT/hb.txt" | grep -E "batch|Error" | tail -3
echo "[$(( $(date +%s) - t0 )) s] done"
