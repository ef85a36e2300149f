# Shared helpers of the passNN.sh device scripts (sourced; needs STAGES and OUT set).
t0=$(date +%s)
export PYTHONUNBUFFERED=1 DEEPINFER_ACCELERATOR=nvidia
HERE=$(dirname "$(dirname "${BASH_SOURCE[0]}")")  # deepinfer_nvidia/tests (this file is in its passes/)
GPU=${GPU:-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)}
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }   # elapsed seconds, then the message
has() { [[ ",$STAGES," == *",$1,"* ]]; }              # is stage $1 in the comma-separated STAGES
auto_stages() {  # auto_stages ON_H200 ELSEWHERE: STAGES "auto" becomes the first on an H200, else the second; stamps
  [ "$STAGES" = auto ] && case "$GPU" in *H200*) STAGES=$1 ;; *) STAGES=$2 ;; esac
  stamp "$GPU: stages $STAGES"
}
quiet() { grep -vE "Warning|warn"; }                  # drop warning lines from a log stream
mkdir -p "$OUT"
xdist_files() {  # xdist_files TAG pytest-args...: one line per finished test into $OUT/TAG.txt, then a count
  local tag=$1; shift
  timeout "${FILE_S:-540}" python3 -m pytest -n "${WORKERS:-14}" -v -p no:cacheprovider -rfE "$@" \
    > "$OUT/$tag.log" 2>&1
  echo "$tag rc=$?"
  grep -oE "(PASSED|FAILED|SKIPPED|ERROR) deepinfer_nvidia/tests/\S+" "$OUT/$tag.log" | sort -k2 > "$OUT/$tag.txt"
  awk '{print $1}' "$OUT/$tag.txt" | sort | uniq -c
  grep -E "^(FAILED|ERROR) " "$OUT/$tag.log" | head -20
}
pending() {  # pending TAG FILE RESULTS...: FILE's tests (PENDING_K: a -k expression) that no RESULTS file lists
  # as PASSED (result lines "PASSED id" of earlier passes, from docs/perf), run over xdist
  local tag=$1 file=$2; shift 2
  python3 -m pytest --collect-only -q -p no:cacheprovider ${PENDING_K:+-k "$PENDING_K"} "$file" 2>/dev/null \
    | grep "::" > "$OUT/$tag.all"
  cat "$@" 2>/dev/null | grep -oE "PASSED \S+" | awk '{print $2}' | sort -u > "$OUT/$tag.done"
  grep -vxFf "$OUT/$tag.done" "$OUT/$tag.all" > "$OUT/$tag.todo"
  echo "$tag: $(wc -l < "$OUT/$tag.todo") of $(wc -l < "$OUT/$tag.all") not yet passed"
  [ -s "$OUT/$tag.todo" ] && xdist_files "$tag" $(cat "$OUT/$tag.todo")
}
rows_vals() {  # rows_vals KNOB A B: the V4.1 rows at batch 1 and 64 with KNOB=A, =B, =A, =B (one warm process each)
  local knob=$1 a=$2 b=$3
  for v in $a $b $a $b; do
    echo "== $knob=$v"
    env "$knob=$v" timeout 110 python3 benchmarks/sweep.py --arch v41 --out "$OUT/v41_$v" --providers triton \
      --decode 1,64 --prefill "" --skip-hf --graphs --profile-decode "" 2>&1 | grep -E "pipelined|Error" \
      | sed -E 's/capture.*alternated/alternated/'
  done | tee -a "$OUT/rows_vals.txt"
  rm -rf "$OUT"/v41_*  # the JSON and plots of each row: not needed, and they crowd what comes back
  python3 benchmarks/ab_rows.py "$OUT/rows_vals.txt"
}
v4_rows_vals() {  # v4_rows_vals KNOB V...: the V4 batch-32 row (the HF row's shape, 2 layers, 128-token contexts,
  # HF itself skipped) with KNOB at each value in turn (one warm process each)
  local knob=$1; shift
  for v in "$@"; do
    echo "== $knob=$v"
    env "$knob=$v" timeout 90 python3 benchmarks/sweep.py --out "$OUT/v4_$v" --providers triton --layers 2 \
      --context 128 --decode 32 --prefill "" --skip-hf --graphs --reps 9 --budget-s 70 --profile-decode "" 2>&1 \
      | grep -E "pipelined|Error"
  done | tee -a "$OUT/v4_rows_vals.txt"
  rm -rf "$OUT"/v4_*
}
v41_row() {  # v41_row LABEL DECODES ENV...: one V4.1 sweep process with ENV (VAR=value words), its graphed rows
  local label=$1 decodes=$2; shift 2
  echo "== $label"
  env "$@" timeout 200 python3 benchmarks/sweep.py --arch v41 --out "$OUT/row" --providers triton --decode "$decodes" \
    --prefill "" --skip-hf --graphs --profile-decode "" 2>&1 | grep -E "pipelined|Error" | sed -E 's/capture [0-9.]+ s, //'
  rm -rf "$OUT/row"
}
v41_rows() {  # v41_rows TAG DECODES "LABEL|ENV..." ...: one v41_row a spec, in order, into $OUT/TAG.txt, summarised
  local tag=$1 decodes=$2; shift 2
  for spec in "$@"; do v41_row "${spec%%|*}" "$decodes" ${spec#*|}; done | tee -a "$OUT/$tag.txt"
  python3 benchmarks/ab_rows.py "$OUT/$tag.txt"
}
v41_sweep() {  # v41_sweep: the issue's full V4.1 sweep at the current defaults (decode 1, 8, 64, 256, prefill 1k, 8k,
  # graphed; JSON + PNG into $OUT/sweep, the log into $OUT/sweep_v41.txt), its summary lines printed (~5 minutes)
  timeout 330 python3 benchmarks/sweep.py --arch v41 --out "$OUT/sweep" --providers triton --decode 1,8,64,256 \
    --prefill 1024,8192 --skip-hf --graphs --reps 9 --budget-s 240 --profile-decode "" 2>&1 | quiet \
    | tee "$OUT/sweep_v41.txt" | grep -E "pipelined|prefill|TB/s|Error" | sed -E 's/capture [0-9.]+ s, //'
}
v41_sweep_b1() {  # v41_sweep_b1 PASS LIMIT_S: v41_sweep, then up to two more batch-1 readings (one process each, while
  # the call is under LIMIT_S seconds: the target row's spread) into $OUT/b1_rows.txt
  stamp sweep
  v41_sweep
  for r in 2 3; do
    [ $(( $(date +%s) - t0 )) -lt "$2" ] && v41_row "defaults, reading $r" 1 DEEPINFER_PASS="$1"
  done | tee "$OUT/b1_rows.txt"
}
v41_profile() {  # v41_profile: a batch-1 profile of the V4.1 slice (graphed, PDL on) into $OUT/profile_v41_b1.txt
  timeout 150 python3 benchmarks/sweep.py --arch v41 --out "$OUT/prof" --providers triton --decode 1 --prefill "" \
    --skip-hf --graphs --profile-decode 1 2>&1 | quiet | grep -E "launches|pipelined|Error" | head -8
  cp "$OUT/prof/profile.txt" "$OUT/profile_v41_b1.txt" 2>/dev/null
  rm -rf "$OUT/prof"
}
v41_alt() {  # v41_alt TAG KNOB A B: the V4.1 batch-1 row with KNOB=A, =B, =A, =B (one process each), into $OUT/TAG.txt
  local tag=$1 knob=$2 a=$3 b=$4
  for v in $a $b $a $b; do v41_row "$knob=$v" 1 "$knob=$v"; done | tee -a "$OUT/$tag.txt"
  python3 benchmarks/ab_rows.py "$OUT/$tag.txt"  # per label: readings, mean, change, separated or not
}
v41_alt_until() {  # v41_alt_until TAG KNOB A B LIMIT_S: the V4.1 batch-1 row with KNOB=A, then =B, repeated while the
  # call is under LIMIT_S seconds (one process each), into $OUT/TAG.txt, summarised
  local tag=$1 knob=$2 a=$3 b=$4 limit=$5
  while [ $(( $(date +%s) - t0 )) -lt "$limit" ]; do
    v41_row "$knob=$a" 1 "$knob=$a"
    v41_row "$knob=$b" 1 "$knob=$b"
  done | tee "$OUT/$tag.txt"
  python3 benchmarks/ab_rows.py "$OUT/$tag.txt"
}

trace_profile() {  # trace_profile TAG ENV...: the batch-1 profile with its chrome traces, into $OUT (3 files)
  local tag=$1; shift
  env DEEPINFER_SWEEP_TRACE=1 "$@" timeout 200 python3 benchmarks/sweep.py --arch v41 --out "$OUT/prof_$tag" \
    --providers triton --decode 1 --prefill "" --skip-hf --graphs --profile-decode 1 2>&1 | quiet \
    | grep -E "launches|pipelined|Error" | head -8
  cp "$OUT/prof_$tag/profile.txt" "$OUT/profile_v41_b1_$tag.txt" 2>/dev/null
  for f in "$OUT/prof_$tag"/trace_*.json; do [ -e "$f" ] && gzip -c "$f" > "$OUT/${tag}_$(basename "$f").gz"; done
  rm -rf "$OUT/prof_$tag"
}

device_tests() {  # device_tests TAG LIMIT_S LINES PYTEST_ARGS...: device test files or ids over 8 xdist workers (a
  # prefix VAR=value reaches pytest), the last LINES lines of its output printed and kept in $OUT/TAG.txt
  local tag=$1 limit=$2 lines=$3; shift 3
  timeout "$limit" python3 -m pytest -q -p no:cacheprovider -n 8 "$@" 2>&1 | tail -"$lines" | tee "$OUT/$tag.txt"
}

rows_stage() {  # rows_stage PASS LIMIT_S: when "rows" is asked for, up to three V4.1 readings at batch 1 and 64 (one
  # process each, while the call is under LIMIT_S seconds; ROWS_S overrides) into $OUT/rows.txt
  has rows || return 0
  stamp rows
  for r in 1 2 3; do
    [ $(( $(date +%s) - t0 )) -lt "${ROWS_S:-$2}" ] && v41_row "defaults, reading $r" 1,64 DEEPINFER_PASS="$1"
  done | tee "$OUT/rows.txt"
}

ab_stage() {  # ab_stage STAGE KNOB A B: when STAGE is asked for, v41_alt into $OUT/STAGE_rows.txt (KNOB=A, =B, =A, =B)
  has "$1" || return 0
  stamp "$1: rows"
  v41_alt "$1_rows" "$2" "$3" "$4"
}
