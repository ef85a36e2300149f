#!/usr/bin/env bash
# Ninth-pass kernel checks and timings on one GPU, in one call (docs/performance.md, ninth pass):
#   OUT=dir bash deepinfer_nvidia/tests/kernels_pass9.sh [STAGES]
# conf  conformance of the word split-K MXFP4 experts, the FP8 GEMMs (fine [32, 32] path included) and the
#       cache.write_rows kernel; moe  bench_moe at V4.1 widths (split-K variants vs the grouped path, graphs);
# fp8   bench_fp8 (general vs fine-scale FP8 kernels at V4.1 shapes, graphs). Each stage has its own limit.
set -u
OUT=${OUT:-.}
STAGES=${1:-conf moe fp8}
export PYTHONUNBUFFERED=1 DEEPINFER_ACCELERATOR=nvidia
t0=$(date +%s)
for s in $STAGES; do
  echo "[$(( $(date +%s) - t0 )) s] stage $s"
  case $s in
    conf) timeout "${CONF_S:-200}" python3 -m pytest -q -p no:cacheprovider -x deepinfer_nvidia/tests/test_conformance.py \
            -k "splitk or fp8 or harness" $(ls deepinfer_nvidia/tests/test_conformance_cache.py 2>/dev/null) \
            2>&1 | tee "$OUT/conformance.txt" | tail -15 ;;
    moe) timeout "${MOE_S:-170}" python3 -m deepinfer_nvidia.tests.bench_moe --out "$OUT" --arch v41 \
            --tokens 1,8,32,64,128,256 --variants 64x4x3x0 2>&1 | tee "$OUT/bench_moe.txt" \
            | grep -E "parity|splitk|split-K|T=|error" | tail -30 ;;
    fp8) timeout "${FP8_S:-170}" python3 -m deepinfer_nvidia.tests.bench_fp8 --out "$OUT" 2>&1 \
            | tee "$OUT/bench_fp8.txt" | grep -E "bandwidth|one V4.1|M=|error" | tail -30 ;;
  esac
done
echo "[$(( $(date +%s) - t0 )) s] done"
