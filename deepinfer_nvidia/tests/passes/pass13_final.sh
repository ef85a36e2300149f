#!/usr/bin/env bash
# The thirteenth pass's last sweep (the committed code): OUT=dir bash deepinfer_nvidia/tests/passes/pass13_final.sh
set -u
OUT=${OUT:-.}
export PYTHONUNBUFFERED=1 DEEPINFER_ACCELERATOR=nvidia DEEPINFER_NV_SWAP_PAIRS=${DEEPINFER_NV_SWAP_PAIRS:-1,98304}
t0=$(date +%s)
timeout "${V41_S:-300}" python3 benchmarks/sweep.py --arch v41 --out "$OUT/v41" --providers triton \
  --decode 1,8,64,256 --prefill 1024,8192 --hf-batch 32 --skip-hf --graphs --reps 9 --budget-s "${V41_BUDGET:-240}" \
  --profile-decode 1,64 2>&1 | tee "$OUT/sweep_v41.txt" | grep -vE "Warning|warn" | tail -16
echo "[$(( $(date +%s) - t0 )) s] done"
