#!/usr/bin/env bash
# Engine benchmarks on the full-width DeepSeek-V4.1-Flash slice (H200; not run in CI).
#   bash deepinfer_nvidia/tests/slice_engine.sh [LAYERS] [STAGES]
# Writes the slice as a native checkpoint (benchmarks/sweep.py --save-checkpoint), then runs, each
# under its own time limit so a slow stage leaves the others' output: spec (benchmarks/spec_decode.py,
# DSpark off / on / on + confidence at batch 1, 8, 64), prefix (benchmarks/prefix_cache.py,
# system prompt + questions and multi-turn: caching off / exact / bounded), accuracy (bounded replay vs
# a cold run), syncs (graphs_syncs.py on the tiny checkpoints). LAYERS 7 is the smallest slice with
# a layer after the last kv-source layer (decoder-side replay): 7 x 7.5 GB of MXFP4 experts.
set -u
LAYERS=${1:-7}
STAGES=${2:-spec,prefix,accuracy,syncs}
OUT=${OUT:-/tmp/out}
CKPT=${CKPT:-/tmp/v41_slice}
mkdir -p "$OUT"
has() { [[ ",$STAGES," == *",$1,"* ]]; }
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
df -h /tmp | tail -1; free -g | head -2
stamp "build + save"
python3 benchmarks/sweep.py --arch v41 --layers "$LAYERS" --engram-vocab 65536 --save-checkpoint "$CKPT" \
    --save-only --out "$OUT/sweep" ${SWEEP_ARGS:-} 2>&1 | tail -4  # SWEEP_ARGS="--tiny --device cpu": smoke run
du -sh "$CKPT"
if has spec; then
    stamp "spec_decode"
    timeout "${SPEC_S:-220}" python3 benchmarks/spec_decode.py --model "$CKPT" --dtype bfloat16 --batches 1,8,64 \
        --max-tokens 32 --json "$OUT/spec_decode_slice.json" 2>&1 | grep -v Warning | tail -20
fi
if has prefix; then
    stamp "prefix_cache"
    timeout "${PREFIX_S:-240}" python3 benchmarks/prefix_cache.py --model "$CKPT" --dtype bfloat16 \
        --workloads system+questions,multi-turn 2>&1 | grep -v Warning | tail -12
fi
if has accuracy; then
    stamp "prefix accuracy"
    timeout "${ACC_S:-150}" python3 benchmarks/prefix_cache.py --model "$CKPT" --dtype bfloat16 --workloads accuracy \
        --num-prompts 8 --accuracy-modes "${ACC_MODES:-bounded,exact}" 2>&1 | grep -v Warning | tail -8
fi
if has syncs; then
    stamp "graphs_syncs"
    timeout 90 python3 -m deepinfer_nvidia.tests.graphs_syncs 2>&1 | grep -v Warning | tail -30
fi
stamp done
