#!/usr/bin/env bash
# Push-T env steps/s on one thread: diffrl vs gym-pusht 0.1.8, same workloads, one run.
# Prints a table of ratios (machine-independent) and writes docs-ready JSON lines to
# ${OUT:-target/bench_pusht.jsonl}. Usage: tools/bench_pusht.sh [diffrl_steps] [gym_steps]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(tools/venv.sh)
cargo build --release --locked -q -p diffrl-cli
BIN=${CARGO_TARGET_DIR:-target}/release/diffrl
n_rust=${1:-30000}
n_py=${2:-3000}
out=${OUT:-target/bench_pusht.jsonl}
mkdir -p "$(dirname "$out")"
: > "$out"
printf '%-8s %-8s %14s %14s %8s\n' obs workload "gym steps/s" "diffrl steps/s" ratio
for obs in state pixels; do
  for workload in random push; do
    steps=$n_rust; [ "$obs" = pixels ] && steps=$((n_rust / 3))
    g=$(taskset -c 0 "$PY" tools/bench_pusht.py --obs "$obs" --workload "$workload" --steps "$n_py" 2>/dev/null || "$PY" tools/bench_pusht.py --obs "$obs" --workload "$workload" --steps "$n_py")
    r=$(taskset -c 0 "$BIN" bench pusht --obs "$obs" --workload "$workload" --steps "$steps" 2>/dev/null || "$BIN" bench pusht --obs "$obs" --workload "$workload" --steps "$steps")
    echo "$g" >> "$out"; echo "$r" >> "$out"
    "$PY" - "$g" "$r" <<'PYEOF'
import json, sys
g, r = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(f"{g['obs']:<8} {g['workload']:<8} {g['steps_per_s']:14.0f} {r['steps_per_s']:14.0f} {r['steps_per_s'] / g['steps_per_s']:7.1f}x")
PYEOF
  done
done
echo "raw results: $out"
