#!/usr/bin/env bash
# Logging overhead of --rerun at the default rate: `diffrl grpo` (and `diffrl pretrain`) from a
# BC checkpoint with --rerun off and --rerun save=FILE, alternating, release build. Prints each
# run's training time and the ratio of medians (docs/viz.md).
# Usage: tools/rerun_overhead.sh [POLICY_DIR] [PAIRS] [ITERATIONS] [PRETRAIN_STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/target_dir.sh
policy=${1:-runs/bc45k/policy}
pairs=${2:-3}
iterations=${3:-3}
steps=${4:-2000}
cargo build -q --release -p diffrl-cli --locked
bin=$(mktemp -d)/diffrl
cp "${CARGO_TARGET_DIR:-target}/release/diffrl" "$bin"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp" "$(dirname "$bin")"' EXIT
# Each run prints "wall_s cpu_s" of the whole command (training plus, for pretrain, the final
# evaluation): CPU time counts Rerun's own threads too, which compete with training on a small
# machine.
timed() {
  local TIMEFORMAT='%R %U %S'
  { time "$@" > /dev/null 2>&1; } 2>&1 | awk '{printf "%.2f %.2f\n", $1, $2 + $3}'
}
grpo() { # $1 = --rerun value
  rm -rf "$tmp/out"
  timed "$bin" grpo --policy "$policy" --out "$tmp/out" --iterations "$iterations" \
    --eval-episodes 0 --rerun "$1"
}
pretrain() {
  rm -rf "$tmp/bc"
  timed "$bin" pretrain --dataset assets/pusht_expert_200 --out "$tmp/bc" --steps "$steps" \
    --eval-episodes 20 --rerun "$1"
}
median() { sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
for what in grpo pretrain; do
  : > "$tmp/off"; : > "$tmp/on"
  for i in $(seq "$pairs"); do
    off=$($what off); on=$($what "save=$tmp/$what-$i.rrd")
    echo "$what pair $i: off ${off% *} s wall / ${off#* } s cpu, save ${on% *} s wall / ${on#* } s cpu ($(stat -c %s "$tmp/$what-$i.rrd") bytes)"
    echo "$off" >> "$tmp/off"; echo "$on" >> "$tmp/on"
  done
  for col in 1 2; do
    mo=$(cut -d' ' -f$col "$tmp/off" | median); ms=$(cut -d' ' -f$col "$tmp/on" | median)
    echo "$what $( [ $col = 1 ] && echo wall || echo cpu ): median off ${mo} s, save ${ms} s, ratio $(awk -v a="$ms" -v b="$mo" 'BEGIN {printf "%.3f", a / b}')"
  done
done
