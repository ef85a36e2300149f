#!/usr/bin/env bash
# Engine benchmarks on the full-width DeepSeek-V4.1-Flash slice (H200; not run in CI).
#   bash deepinfer_nvidia/tests/slice_engine.sh [STAGES]
# The slice is written as a native checkpoint (benchmarks/sweep.py --save-checkpoint) and loaded
# through LLM(dir). Each stage runs under its own time limit, so a slow one leaves the others' output:
#   prefix    benchmarks/prefix_cache.py: system prompt + questions and multi-turn, caching off /
#             exact / bounded; a target-only slice of LAYERS_T (7) layers, the smallest one with a layer
#             after the last kv-source layer (decoder-side replay);
#   accuracy  the same checkpoint: bounded (and exact) replay vs caching off, first-token logits;
#   spec      benchmarks/spec_decode.py: DSpark off / on / on + confidence at batch 1, 8, 64, on a
#             slice of LAYERS_D (4) layers with its mtp.* stages (3 more MoE layers);
#   prefix4 / accuracy4   the prefix workloads / a batch-invariant accuracy run on the 4-layer checkpoint;
#   specbi    spec_decode.py in batch-invariant mode (greedy outputs with DSpark == without);
#   syncs     graphs_syncs.py on the tiny checkpoints.
# Every routed-expert layer is 7.5 GB of MXFP4 on disk; the H200 machine has ~68 GB free, so the
# two checkpoints are written in turn.
set -u
STAGES=${1:-prefix,accuracy,spec,syncs}
LAYERS_T=${LAYERS_T:-7}
LAYERS_D=${LAYERS_D:-4}
OUT=${OUT:-/tmp/out}
CKPT=${CKPT:-/tmp/v41_slice}
mkdir -p "$OUT"
has() { [[ ",$STAGES," == *",$1,"* ]]; }
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
save() {  # save LAYERS [--no-draft]
    rm -rf "$CKPT"
    stamp "build + save: $*"
    python3 benchmarks/sweep.py --arch v41 --layers "$1" --engram-vocab 65536 --save-checkpoint "$CKPT" \
        --save-only --out "$OUT/sweep" ${2:-} ${SWEEP_ARGS:-} 2>&1 | tail -3  # SWEEP_ARGS="--tiny --device cpu": smoke run
    du -sh "$CKPT"
}
df -h /tmp | tail -1
if has prefix || has accuracy; then
    save "$LAYERS_T" --no-draft
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
if has spec || has prefix4 || has accuracy4; then
    save "$LAYERS_D"
fi
if has spec; then
    stamp "spec_decode"
    timeout "${SPEC_S:-220}" python3 benchmarks/spec_decode.py --model "$CKPT" --dtype bfloat16 --batches 1,8,64 \
        --max-tokens 32 --json "$OUT/spec_decode_slice.json" 2>&1 | grep -v Warning | tail -20
fi
if has prefix4; then  # the prefix workloads on the 4-layer checkpoint (no decoder-side replay there)
    stamp "prefix_cache (4 layers)"
    timeout "${PREFIX_S:-240}" python3 benchmarks/prefix_cache.py --model "$CKPT" --dtype bfloat16 \
        --workloads "${PREFIX_WORKLOADS:-system+questions,multi-turn}" 2>&1 | grep -v Warning | tail -12
fi
if has accuracy4; then  # batch-invariant: exact hits are bit-identical, the rest is replay's own error
    stamp "prefix accuracy (4 layers, batch-invariant)"
    timeout "${ACC_S:-150}" python3 benchmarks/prefix_cache.py --model "$CKPT" --dtype bfloat16 --workloads accuracy \
        --num-prompts 8 --accuracy-modes "${ACC_MODES:-bounded,exact}" --batch-invariant 2>&1 | grep -v Warning | tail -8
fi
if has specbi; then  # greedy DSpark on == off needs batch-invariant kernels at these widths
    stamp "spec_decode (batch-invariant)"
    timeout "${SPECBI_S:-150}" python3 benchmarks/spec_decode.py --model "$CKPT" --dtype bfloat16 --batches 1,8 \
        --max-tokens 16 --batch-invariant --json "$OUT/spec_decode_slice_bi.json" 2>&1 | grep -v Warning | tail -10
fi
if has syncs; then
    stamp "graphs_syncs"
    timeout 90 python3 -m deepinfer_nvidia.tests.graphs_syncs 2>&1 | grep -v Warning | tail -30
fi
stamp done
