#!/usr/bin/env bash
# Push-T env steps/s on one core: diffrl vs gym-pusht 0.1.8, same workloads, in one run.
# Each (obs, workload) pair is timed ROUNDS times, gym-pusht and diffrl interleaved on the
# same core, and the table shows medians and the median of the per-round ratios (ratios, not
# absolute numbers, are what carry across machines). Raw JSON lines go to
# ${OUT:-target/bench_pusht.jsonl}.
# Usage: tools/bench_pusht.sh [diffrl_steps=60000] [gym_steps=5000] [rounds=3]
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/target_dir.sh
PY=$(tools/venv.sh)
cargo build --release --locked -q -p diffrl-cli
BIN=${CARGO_TARGET_DIR:-target}/release/diffrl
n_rust=${1:-60000}
n_py=${2:-5000}
rounds=${3:-3}
out=${OUT:-target/bench_pusht.jsonl}
mkdir -p "$(dirname "$out")"
: > "$out"
pin() { if command -v taskset >/dev/null; then taskset -c 0 "$@"; else "$@"; fi; }
for obs in state pixels; do
  for workload in random push; do
    steps=$n_rust; [ "$obs" = pixels ] && steps=$((n_rust / 4))
    for _ in $(seq "$rounds"); do
      pin "$PY" tools/bench_pusht.py --obs "$obs" --workload "$workload" --steps "$n_py" >> "$out"
      pin "$BIN" bench pusht --obs "$obs" --workload "$workload" --steps "$steps" >> "$out"
    done
  done
done
"$PY" - "$out" <<'PYEOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"{'obs':<7} {'workload':<8} {'gym-pusht steps/s':>18} {'diffrl steps/s':>15} {'ratio (median, min-max)':>26}")
for obs in ["state", "pixels"]:
    for wl in ["random", "push"]:
        g = [r["steps_per_s"] for r in rows if r["impl"] == "gym-pusht" and r["obs"] == obs and r["workload"] == wl]
        d = [r["steps_per_s"] for r in rows if r["impl"] == "diffrl" and r["obs"] == obs and r["workload"] == wl]
        ratios = [b / a for a, b in zip(g, d)]
        print(f"{obs:<7} {wl:<8} {statistics.median(g):18.0f} {statistics.median(d):15.0f} "
              f"{statistics.median(ratios):10.1f}x ({min(ratios):.1f}-{max(ratios):.1f}x)")
PYEOF
echo "raw results: $out"
