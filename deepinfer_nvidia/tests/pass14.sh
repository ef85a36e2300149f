#!/usr/bin/env bash
# Fourteenth pass, first call: OUT=dir bash deepinfer_nvidia/tests/pass14.sh
#   conformance of the Engram kernels, both align forms and the tiled indexer; align and indexer timings; the 8k prefill's ops by
#   the repository lines that launch them (with the Engram kernels in).
set -u
OUT=${OUT:-.}
export PYTHONUNBUFFERED=1 DEEPINFER_ACCELERATOR=nvidia DEEPINFER_NV_SWAP_PAIRS=${DEEPINFER_NV_SWAP_PAIRS:-1,98304}
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
mkdir -p "$OUT"
stamp conformance
timeout 180 python3 -m pytest -q deepinfer_nvidia/tests/test_conformance.py \
  deepinfer_nvidia/tests/test_conformance_engram.py deepinfer_nvidia/tests/test_batch_invariance.py -k \
  "engram or align or index or every_invariant" 2>&1 | tail -6 | tee "$OUT/conformance.txt"
stamp indexer
timeout 150 python3 -m deepinfer_nvidia.tests.bench_indexer --out "$OUT" 2>&1 | grep -vE "Warning|warn" | tail -4
stamp align
timeout 120 python3 -m deepinfer_nvidia.tests.bench_align --out "$OUT" 2>&1 | grep -vE "Warning|warn" | tail -6
stamp stacks
timeout "${STACKS_S:-170}" python3 -m deepinfer_nvidia.tests.prefill_stacks --out "$OUT" --tokens 8192 --depth 4 \
  --ops aten::copy_,aten::mul,aten::add,aten::index,aten::where,aten::pow,aten::mean,aten::clone,aten::mm,aten::bmm \
  2>&1 | grep -vE "Warning|warn" | head -90
stamp done
