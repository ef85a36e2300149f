#!/usr/bin/env bash
# Fifty-third pass's device stages: OUT=dir bash pass53.sh STAGES (comma-separated; at most ~9 minutes a call).
#   tests    the one-token route-and-layout launch (moe.topk_experts_mxfp4, triton_route_align): its device tests
#            (bit-equal to the parts; graph replays route afresh) and the harness of the op, of route_topk and of
#            experts_mxfp4 (align_small's launch shares its permute body with the new kernel since c2c08df), under
#            TESTS_S (default 300) s. pass53a's first form also took test_conformance's MoE cases and ran out of time.
#   alt      DEEPINFER_NV_ROUTE_ALIGN 0 / 1 (0: the route, then the align launch, as before this pass), the V4.1
#            batch-1 row alternated while the call is under ALT_S (default 400) s. Predicted (pass46c's timeline:
#            8 align launches, 20.8 us, plus their handoffs): -15 to -25 us at batch 1.
#   launches the batch-1 profile (kernels a step, their times) with the knob 0 and 1 (~1.5 minutes).
#   rows     the issue's two decode targets at this pass's defaults, up to three processes while under ROWS_S s.
#   parity   parity_tiny at the defaults (greedy tokens vs the CPU reference, bf16 logits' error ratio).
#   sweep    the issue's full V4.1 sweep at the defaults (~5 minutes).
# auto (the default): tests,alt,parity on any card. Carry .whl/ (the device has no network).
set -u
STAGES=${1:-auto}
OUT=${OUT:-.}
source "$(dirname "$0")/pass_lib.sh"  # GPU, stamp, has, quiet, auto_stages; exports; HERE
auto_stages tests,alt,parity tests,alt,parity
if has tests; then
  stamp "tests: route-align device tests and the harness"
  device_tests route_align_tests "${TESTS_S:-300}" 16 -v "$HERE/test_route_align_device.py" \
    "$HERE/test_conformance.py::test_harness[moe.topk_experts_mxfp4-triton]" \
    "$HERE/test_conformance.py::test_harness[moe.route_topk-triton]" \
    "$HERE/test_conformance.py::test_harness[moe.experts_mxfp4-triton]"
fi
if has alt; then
  stamp "alt: rows"
  v41_alt_until alt_rows DEEPINFER_NV_ROUTE_ALIGN 0 1 "${ALT_S:-400}"
fi
if has launches; then  # the batch-1 step's kernel count and chain with the knob each way (profile, PDL on)
  for v in 0 1; do stamp "launches: DEEPINFER_NV_ROUTE_ALIGN=$v"; DEEPINFER_NV_ROUTE_ALIGN=$v v41_profile
    mv "$OUT/profile_v41_b1.txt" "$OUT/profile_route_align_$v.txt" 2>/dev/null; done
fi
rows_stage 53 "${ROWS_S:-110}"
if has sweep; then stamp sweep; v41_sweep; fi
if has parity && [ $(( $(date +%s) - t0 )) -lt 480 ]; then
  stamp parity
  timeout 100 python3 -m deepinfer_nvidia.tests.parity_tiny 2>&1 | quiet | tail -12 | tee "$OUT/parity.txt"
fi
stamp done
