#!/usr/bin/env bash
# Twelfth-pass device checks in one call (docs/performance.md, twelfth pass):
#   OUT=dir bash deepinfer_nvidia/tests/passes/pass12.sh
# 1. conformance of the swap-AB wgmma FP8 GEMV (gluon_fp8_gemv); if it fails, the path is switched off
#    (DEEPINFER_NV_WGMMA_GEMV=0) for the rest of the call, so the timings below are never of wrong code;
# 2. bench_fp8 at 1 and 8 rows: the wgmma GEMV against the CUDA-core GEMV and the tensor-core kernels;
# 3. the 8-layer V4.1 sweep (graphs), profiling decode at batch 1 and 64 and prefill at 8k.
set -u
OUT=${OUT:-.}
export PYTHONUNBUFFERED=1 DEEPINFER_ACCELERATOR=nvidia DEEPINFER_NV_SWAP_PAIRS=${DEEPINFER_NV_SWAP_PAIRS:-1,98304}
t0=$(date +%s)
echo "[$(( $(date +%s) - t0 )) s] conformance"
timeout "${WG_S:-130}" python3 -m pytest -q -p no:cacheprovider deepinfer_nvidia/tests/test_conformance_fp8_wgmma.py \
  2>&1 | tee "$OUT/conformance_wgmma.txt" | tail -6
if ! grep -qE "^[0-9]+ passed" "$OUT/conformance_wgmma.txt" || grep -qE "failed|error" "$OUT/conformance_wgmma.txt"; then
  export DEEPINFER_NV_WGMMA_GEMV=0; echo "wgmma GEMV conformance not clean: DEEPINFER_NV_WGMMA_GEMV=0 from here"
fi
echo "[$(( $(date +%s) - t0 )) s] bench_fp8"
timeout "${FP8_S:-110}" python3 -m deepinfer_nvidia.tests.bench_fp8 --out "$OUT" --rows 1,8 --variants 128x64x2x4x4 \
  --gemv-variants 32x256x4x4,32x256x16x4x1 --wgmma-programs 4,16 2>&1 | tee "$OUT/bench_fp8.txt" \
  | grep -E "bandwidth|one V4.1|^M=|rings|error" | tail -12
echo "[$(( $(date +%s) - t0 )) s] v41 sweep"
timeout "${V41_S:-300}" python3 benchmarks/sweep.py --arch v41 --out "$OUT/v41" --providers triton \
  --decode 1,8,64,256 --prefill 8192,1024 --hf-batch 32 --skip-hf --graphs --reps 5 --budget-s "${V41_BUDGET:-240}" \
  --profile-decode 1,64 2>&1 | tee "$OUT/sweep_v41.txt" | grep -vE "Warning|warn" | tail -22
echo "[$(( $(date +%s) - t0 )) s] done"
