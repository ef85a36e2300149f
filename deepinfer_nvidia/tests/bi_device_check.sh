#!/usr/bin/env bash
# Batch-invariant kernels on one GPU, in one call (docs/determinism.md):
#   bash deepinfer_nvidia/tests/bi_device_check.sh [STAGES]     (OUT=dir for the logs; default .)
# STAGES (default "rows tiny sweep conf"): rows = bitwise row checks of every kernel registered
# batch-invariant; conf = model-width conformance of the triton_bi launches + the shared harness
# for the triton_bi entries; tiny = end-to-end logits alone / batch / chunked; sweep = default vs batch-invariant
# decode ms/step on the 2-layer V4 slice. Each stage has its own time limit so one hang cannot eat the call.
set -u
OUT=${OUT:-.}
STAGES=${1:-rows tiny sweep conf}
export PYTHONUNBUFFERED=1 DEEPINFER_ACCELERATOR=nvidia
for s in $STAGES; do
  case $s in
    rows) timeout 120 python3 -m pytest -q -p no:cacheprovider deepinfer_nvidia/tests/test_batch_invariance.py \
            2>&1 | tee "$OUT/bi_rows.txt" | tail -25 ;;
    conf) timeout 50 python3 -m pytest -q -p no:cacheprovider deepinfer_nvidia/tests/test_conformance.py \
            -k triton_bi 2>&1 | tee "$OUT/bi_conformance.txt" | tail -15 ;;
    tiny) timeout 60 python3 -m deepinfer_nvidia.tests.invariance_tiny 2>&1 | tee "$OUT/invariance_tiny.txt" \
            | grep -v Warning | tail -8 ;;
    sweep) timeout 130 python3 benchmarks/sweep.py --out "$OUT" --providers triton,bi --layers 2 --decode 1,8,64 \
             --prefill "" --hf-batch 64 --skip-hf --reps 5 --profile-decode "" --budget-s 115 \
             2>&1 | tee "$OUT/sweep_bi_log.txt" | grep -E "ms \(meta|budget|Error|error" ;;
  esac
done
