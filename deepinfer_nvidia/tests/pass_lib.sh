# Shared helpers of the passNN.sh device scripts (sourced; needs STAGES and OUT set).
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }   # elapsed seconds, then the message
has() { [[ ",$STAGES," == *",$1,"* ]]; }              # is stage $1 in the comma-separated STAGES
quiet() { grep -vE "Warning|warn"; }                  # drop warning lines from a log stream
mkdir -p "$OUT"
