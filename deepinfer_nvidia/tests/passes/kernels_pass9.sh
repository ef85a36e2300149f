#!/usr/bin/env bash
# Ninth-pass kernel checks and timings on one GPU, in one call (docs/performance.md, ninth pass):
#   OUT=dir bash deepinfer_nvidia/tests/passes/kernels_pass9.sh [STAGES]
# ops   conformance of the step slot-metadata ops, cache.write_rows, index.topk and (when present) the sampler,
#       routing and compressor kernels (whole files);
# bi    row-invariance checks of the new batch-invariant launches (grouped FP8, write_rows);
# conf  conformance of the word split-K MXFP4 experts, the FP8 GEMMs (fine [32, 32] path included) and the
#       cache.write_rows kernel; moe  bench_moe at V4.1 widths (split-K variants vs the grouped path, graphs);
# fp8   bench_fp8 (general vs fine-scale FP8 kernels at V4.1 shapes, graphs);
# v4    the 2-layer V4 sweep with graphs and the HF transformers peer at batch 32;
# scaled bench_moe at V4.1 widths for the tl.dot_scaled expert path (tenth pass) against split-K, the
#       grouped kernels and dequant-once, decode to prefill sizes;
# small bench_small_ops: index.topk, the sampler filter, routing and pooling kernels against their references;
# v41   the 8-layer V4.1 sweep with graphs (no HF peer: transformers has V4 only). Each stage has its own limit.
# swap  bench_swap: the Gluon swap-AB expert kernels (eleventh pass): parity, then timings against the default
#       path; writes swap_pairs.txt, the pair range where they won, which later stages export as
#       DEEPINFER_NV_SWAP_PAIRS unless it is already set;
# new   conformance of the eleventh pass's kernels (swap experts, folded GEMV, one-launch align);
# parity parity_tiny (fp32 tokens and logits, bf16 against the fp32 truth).
set -u
OUT=${OUT:-.}
STAGES=${1:-conf moe fp8}
export PYTHONUNBUFFERED=1 DEEPINFER_ACCELERATOR=nvidia
t0=$(date +%s)
for s in $STAGES; do
  echo "[$(( $(date +%s) - t0 )) s] stage $s"
  if [ -z "${DEEPINFER_NV_SWAP_PAIRS:-}" ] && [ -s "$OUT/swap_pairs.txt" ]; then
    export DEEPINFER_NV_SWAP_PAIRS=$(cat "$OUT/swap_pairs.txt"); echo "DEEPINFER_NV_SWAP_PAIRS=$DEEPINFER_NV_SWAP_PAIRS"
  fi
  case $s in
    swap) timeout "${SWAP_S:-240}" python3 -m deepinfer_nvidia.tests.bench_swap --out "$OUT" ${SWAP_ARGS:-} 2>&1 \
            | tee "$OUT/bench_swap.txt" | grep -vE "^  T=.*rel [0-9.e-]+$" | tail -40 ;;
    new) timeout "${NEW_S:-150}" python3 -m pytest -q -p no:cacheprovider deepinfer_nvidia/tests/test_conformance.py \
            deepinfer_nvidia/tests/test_conformance_moe_swap.py \
            -k "${NEW_K:-swap or gemv or align}" 2>&1 | tee "$OUT/conformance_new.txt" | tail -8 ;;
    parity) timeout "${PARITY_S:-120}" python3 -m deepinfer_nvidia.tests.parity_tiny 2>&1 | tee "$OUT/parity.txt" | tail -15 ;;
    conf) timeout "${CONF_S:-200}" python3 -m pytest -q -p no:cacheprovider deepinfer_nvidia/tests/test_conformance.py \
            -k "${CONF_K:-splitk or segments or fp8 or harness}" 2>&1 | tee "$OUT/conformance.txt" | tail -15 ;;
    ops) timeout "${OPS_S:-120}" python3 -m pytest -q -p no:cacheprovider deepinfer_nvidia/tests/test_conformance_kv.py \
            deepinfer_nvidia/tests/test_conformance_cache.py $(ls deepinfer_nvidia/tests/test_conformance_{topk,sampling,route_compress}.py 2>/dev/null) 2>&1 | tee "$OUT/conformance_ops.txt" | tail -15 ;;
    bi) timeout "${BI_S:-60}" python3 -m pytest -q -p no:cacheprovider deepinfer_nvidia/tests/test_batch_invariance.py \
            -k "grouped or write_rows or invariant" 2>&1 | tee "$OUT/bi_rows.txt" | tail -6 ;;
    moe) timeout "${MOE_S:-170}" python3 -m deepinfer_nvidia.tests.bench_moe --out "$OUT" --arch v41 \
            --tokens 1,8,32,64,128,256 --variants 64x4x3x0 2>&1 | tee "$OUT/bench_moe.txt" \
            | grep -E "parity|split-K|segments|  T=|chosen|error" | tail -30 ;;
    scaled) timeout "${SCALED_S:-240}" python3 -m deepinfer_nvidia.tests.bench_moe --out "$OUT" --arch v41 \
            --tokens ${SCALED_T:-1,8,64,256,1024,8192} --variants 64x4x3x0 --splitk-variants 16x8x4x3x2048x1 --seg-r "" ${SCALED_ARGS:-} \
            2>&1 | tee "$OUT/bench_moe_scaled.txt" | grep -E "parity|dot_scaled|  T=|error|Error" | tail -40 ;;
    small) timeout "${SMALL_S:-120}" python3 -m deepinfer_nvidia.tests.bench_small_ops --out "$OUT" 2>&1 \
            | tee "$OUT/bench_small_ops.txt" | tail -40 ;;
    fp8) timeout "${FP8_S:-170}" python3 -m deepinfer_nvidia.tests.bench_fp8 --out "$OUT" ${FP8_ARGS:-} 2>&1 \
            | tee "$OUT/bench_fp8.txt" | grep -E "bandwidth|one V4.1|^M=|error" | tail -30 ;;
    v4) timeout "${V4_S:-200}" python3 benchmarks/sweep.py --out "$OUT/v4" --providers triton --layers 2 \
            --decode 1,8,64,256 --prefill 1024,8192 --hf-batch 32 --graphs --reps 10 --budget-s 180 --profile-decode 1 \
            \
            2>&1 | tee "$OUT/sweep_v4.txt" | grep -vE "Warning|warn" | tail -25 ;;
    v41) timeout "${V41_S:-260}" python3 benchmarks/sweep.py --arch v41 --out "$OUT/v41" --providers triton \
            --decode 1,8,64,256 --prefill 1024,8192 --hf-batch 32 --skip-hf --graphs --reps 5 --budget-s 180 \
            --profile-decode 1 ${V41_ARGS:-} 2>&1 | tee "$OUT/sweep_v41.txt" | grep -vE "Warning|warn" | tail -25 ;;
  esac
done
echo "[$(( $(date +%s) - t0 )) s] done"
