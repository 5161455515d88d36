#!/usr/bin/env bash
# Agent-steps/s on one core: diffrl's highway-merge (2 agents, ~12 vehicles; `diffrl bench
# highway-merge --workload push`: the expert's actions with +-0.2 noise, the expert's own
# computation included in the timing) against highway-env 1.12.1 on a scene of the same size
# (tools/bench_drive.py: highway-v0, 2 lanes, 2 controlled + 11 IDM vehicles, 15 Hz physics,
# 5 Hz control, small random actions). Rounds interleave the two on the same core; the table
# shows medians and the median of the per-round ratios (docs/driving.md, "Speed").
# Usage: tools/bench_drive.sh [rounds=3] [steps=20000] [peer_steps=500]
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/target_dir.sh
PY=$(tools/venv.sh highway)
rounds=${1:-3}
steps=${2:-20000}
peer_steps=${3:-500}
if [ -n "${DIFFRL_BIN:-}" ]; then
  BIN=$DIFFRL_BIN
else
  cargo build --release --locked -q -p diffrl-cli
  BIN=${CARGO_TARGET_DIR:-target}/release/diffrl
fi
pin() { if command -v taskset >/dev/null; then taskset -c 0 "$@"; else "$@"; fi; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for round in $(seq "$rounds"); do
  SDL_VIDEODRIVER=dummy PYGAME_HIDE_SUPPORT_PROMPT=1 pin "$PY" tools/bench_drive.py "$peer_steps" "$round" >> "$out"
  pin "$BIN" bench highway-merge --workload push --steps "$steps" --seed "$round" >> "$out"
done
"$PY" - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
peer = [r["agent_steps_per_s"] for r in rows if r["impl"] == "highway-env"]
ours = [2 * r["steps_per_s"] for r in rows if r["impl"] == "diffrl"]
ratios = [o / p for o, p in zip(ours, peer)]
print("| simulator | agent-steps/s (median of %d) |" % len(peer))
print("|---|---|")
print("| highway-env 1.12.1 | %.0f |" % statistics.median(peer))
print("| diffrl highway-merge | %.0f |" % statistics.median(ours))
print("ratio (median of per-round ratios): %.0fx" % statistics.median(ratios))
PY
