#!/usr/bin/env bash
# Thirteenth-pass device call (docs/performance.md, thirteenth pass):
#   OUT=dir bash deepinfer_nvidia/tests/passes/pass13.sh
# 0. conformance of the mhc kernels;
# 1. capture_probe: how often a capture of the full-width V4.1 decode step fails (and where);
# 2. the 8-layer V4.1 sweep (graphs; profiles decode at batch 64 and prefill at 8k);
# 3. the 2-layer V4 sweep with the HF transformers peer at batch 32.
set -u
OUT=${OUT:-.}
export PYTHONUNBUFFERED=1 DEEPINFER_ACCELERATOR=nvidia DEEPINFER_NV_SWAP_PAIRS=${DEEPINFER_NV_SWAP_PAIRS:-1,98304}
t0=$(date +%s)
echo "[$(( $(date +%s) - t0 )) s] conformance: mhc.mix (tf32x3 prefill, 256-split decode), the scale check's GEMV"
timeout "${CONF_S:-90}" python3 -m pytest -q -p no:cacheprovider deepinfer_nvidia/tests/test_conformance.py -k "mhc" \
  2>&1 | tee "$OUT/conformance_mhc.txt" | tail -2
echo "[$(( $(date +%s) - t0 )) s] capture probe"
timeout "${PROBE_S:-90}" python3 -m deepinfer_nvidia.tests.capture_probe --rounds 1 --batches 64,1,8,32 \
  > "$OUT/capture_probe.txt" 2>&1; grep -E "^round|summary|Error|error" "$OUT/capture_probe.txt" | tail -12
echo "[$(( $(date +%s) - t0 )) s] v41 sweep"
timeout "${V41_S:-240}" python3 benchmarks/sweep.py --arch v41 --out "$OUT/v41" --providers triton \
  --decode 1,8,64,256 --prefill 1024,8192 --hf-batch 32 --skip-hf --graphs --reps 9 --budget-s "${V41_BUDGET:-200}" \
  --profile-decode 1,64 2>&1 | tee "$OUT/sweep_v41.txt" | grep -vE "Warning|warn" | tail -14
echo "[$(( $(date +%s) - t0 )) s] v4 sweep"
OUT=$OUT V4_S=${V4_S:-200} bash deepinfer_nvidia/tests/passes/kernels_pass9.sh v4 | tail -14
echo "[$(( $(date +%s) - t0 )) s] done"
