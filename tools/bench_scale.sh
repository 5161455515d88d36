#!/usr/bin/env bash
# Rollout throughput against processes on this machine (docs/scale.md): N = 1, 2, 3 concurrent
# `diffrl eval` processes, each with one simulation thread ([run] threads = 1), each stepping
# its environments and sampling the policy's chains (the collection half of data-parallel BC
# and GRPO: every process rolls out on its own, nothing is exchanged). Throughput is the total
# environment steps over the wall time of the slowest process; the table shows medians over
# rounds (interleaved) and the ratio to N = 1, plus one process with a simulation thread per
# core ([run] threads = 0, the default), the single-process alternative. Run it on an idle
# machine.
# Usage: tools/bench_scale.sh POLICY [CONFIG=configs/pusht.toml] [EPISODES=40] [ROUNDS=2]
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/target_dir.sh
policy=${1:?usage: tools/bench_scale.sh POLICY [CONFIG] [EPISODES] [ROUNDS]}
config=${2:-configs/pusht.toml}
episodes=${3:-40}
rounds=${4:-2}
[ -f "$policy/policy.json" ] || { echo "no policy at $policy" >&2; exit 2; }
if [ -n "${DIFFRL_BIN:-}" ]; then
  BIN=$DIFFRL_BIN
else
  cargo build --release --locked -q -p diffrl-cli
  BIN=${CARGO_TARGET_DIR:-target}/release/diffrl
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# One simulation thread per process, whatever the config says.
awk 'BEGIN{r=0} /^\[run\]/{r=1; print; print "threads = 1"; next} /^\[/{r=0} !(r && /^threads *=/){print}' \
  "$config" > "$tmp/config.toml"
grep -q '^\[run\]' "$tmp/config.toml" || printf '[run]\nthreads = 1\n' >> "$tmp/config.toml"
sed 's/^threads = 1$/threads = 0/' "$tmp/config.toml" > "$tmp/config-all.toml"
rows="$tmp/rows.jsonl"
for round in $(seq "$rounds"); do
  for n in 1 2 3 0; do
    # n = 0: one process with a thread per core.
    procs=$n cfg=$tmp/config.toml
    [ "$n" = 0 ] && procs=1 cfg=$tmp/config-all.toml
    start=$(date +%s.%N)
    pids=()
    for i in $(seq "$procs"); do
      "$BIN" eval --policy "$policy" --config "$cfg" --episodes "$episodes" \
        --seed $((1000 * round + i)) --out "$tmp/r$round-n$n-$i.json" > /dev/null &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; done
    end=$(date +%s.%N)
    python3 - "$tmp" "$round" "$n" "$start" "$end" >> "$rows" <<'PY'
import json, sys
tmp, rnd, n, start, end = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
steps = 0
for i in range(1, max(n, 1) + 1):
    e = json.load(open(f"{tmp}/r{rnd}-n{n}-{i}.json"))
    steps += e["episodes"] * e["mean_length"]
print(json.dumps({"round": rnd, "processes": n, "steps": steps, "seconds": end - start,
                  "steps_per_s": steps / (end - start)}))
PY
  done
done
python3 - "$rows" "$(nproc)" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for r in rows:
    what = f"{r['processes']} processes" if r["processes"] else "1 process, threads = 0"
    print(f"round {r['round']}, {what}: {r['steps']:.0f} steps in {r['seconds']:.1f} s")
base = statistics.median(r["steps_per_s"] for r in rows if r["processes"] == 1)
print(f"| processes ({sys.argv[2]} cores) | env steps/s (median) | vs 1 process | per process |")
print("|---|---|---|---|")
for n in (1, 2, 3, 0):
    v = statistics.median(r["steps_per_s"] for r in rows if r["processes"] == n)
    label = f"{n}" if n else "1, threads = 0 (a thread per core)"
    print(f"| {label} | {v:.0f} | {v / base:.2f}x | {v / base / max(n, 1):.2f} |")
PY
