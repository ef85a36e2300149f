#!/usr/bin/env bash
# Fourteenth pass: OUT=dir bash deepinfer_nvidia/tests/passes/pass14.sh [STAGES]
#   conformance  the Engram kernels, align, the tiled indexer, gemm.dense (+ their batch-invariance row checks);
#                pass14e also ran a tf32x3 gemm.dense test file, removed with that kernel
#   indexer      index.scores at prefill sizes: per-token vs tiled variants (bench_indexer)
#   align        align forms at decode sizes (bench_align)
#   stacks       the 8k prefill's ops (prefill_stacks)
#   v41          the V4.1 sweep: decode 1, 8, 64, 256 (graphed) and prefill 1k, 8k
#   v4           the V4 sweep with the HF peer (batch 32, ctx 128)
set -u
STAGES=${1:-conformance,indexer,align,stacks}
OUT=${OUT:-.}
export PYTHONUNBUFFERED=1 DEEPINFER_ACCELERATOR=nvidia DEEPINFER_NV_SWAP_PAIRS=${DEEPINFER_NV_SWAP_PAIRS:-1,98304}
source "$(dirname "$0")/pass_lib.sh"
if has conformance; then
  stamp conformance
  timeout 180 python3 -m pytest -q deepinfer_nvidia/tests/test_conformance.py \
    deepinfer_nvidia/tests/test_conformance_engram.py deepinfer_nvidia/tests/test_batch_invariance.py \
    -k "engram or align or index or every_invariant or dense" 2>&1 | tail -6 | tee "$OUT/conformance.txt"
fi
if has indexer; then
  stamp indexer
  timeout 150 python3 -m deepinfer_nvidia.tests.bench_indexer --out "$OUT" 2>&1 | quiet | tail -4
fi
if has align; then
  stamp align
  timeout 120 python3 -m deepinfer_nvidia.tests.bench_align --out "$OUT" 2>&1 | quiet | tail -6
fi
if has stacks; then
  stamp stacks
  timeout "${STACKS_S:-170}" python3 -m deepinfer_nvidia.tests.prefill_stacks --out "$OUT" --tokens 8192 --depth 4 \
    --ops aten::copy_,aten::mul,aten::add,aten::index,aten::where,aten::clone,aten::mm,aten::bmm 2>&1 | quiet | head -60
fi
if has v41; then
  stamp v41
  timeout "${V41_S:-300}" python3 benchmarks/sweep.py --arch v41 --out "$OUT/v41" --providers triton \
    --decode 1,8,64,256 --prefill 1024,8192 --hf-batch 32 --skip-hf --graphs --reps 9 --budget-s "${V41_BUDGET:-240}" \
    --profile-decode 1,64 2>&1 | tee "$OUT/sweep_v41.txt" | quiet | tail -16
fi
if has v4; then
  stamp v4
  timeout "${V4_S:-200}" python3 benchmarks/sweep.py --out "$OUT/v4" --providers triton --layers 2 \
    --decode 1,64 --prefill 8192 --hf-batch 32 --graphs --reps 9 --budget-s "${V4_BUDGET:-180}" \
    2>&1 | tee "$OUT/sweep_v4.txt" | quiet | tail -16
fi
stamp done
