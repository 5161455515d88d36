#!/usr/bin/env bash
# How well a lang-cubes policy reproduces the expert's first actions on its training states
# (docs/vla.md, "Where it fails"): for frames 0..FRAMES-1 of the first EPISODES episodes of
# DATASET, asks `diffrl serve` (through the pinned openpi-client) for the action with the
# episode's own instruction and prints the mean absolute error of the first action per frame.
# With REFERENCE=1 it also trains the plain numpy MLP of tools/lang_first_actions.py on the
# same frames (the goal's one-hot form included) and prints its errors.
#
# Usage: tools/lang_first_actions.sh POLICY DATASET [CONFIG]
#   CONFIG (default configs/lang-cubes.toml): the policy's run config; its [env] lines
#   `goal_in_state = ...` and `joint_velocities = ...` say which observation to build.
# Environment: EPISODES (120), FRAMES (3), REFERENCE (0), STEPS (10000), DIFFRL (a diffrl
# binary to use instead of building one).
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/target_dir.sh
policy=${1:?usage: tools/lang_first_actions.sh POLICY DATASET [CONFIG]}
dataset=${2:?usage: tools/lang_first_actions.sh POLICY DATASET [CONFIG]}
config=${3:-configs/lang-cubes.toml}
[ -f "$policy/policy.json" ] || { echo "no policy at $policy" >&2; exit 2; }
[ -d "$dataset/data" ] || { echo "no LeRobot dataset at $dataset" >&2; exit 2; }
flag() { sed -n "s/^$1 = \(true\|false\).*/\1/p" "$config" | head -1; }
goal=0; [ "$(flag goal_in_state)" = true ] && goal=1
velocities=1; [ "$(flag joint_velocities)" = false ] && velocities=0
if [ -z "${DIFFRL:-}" ]; then
  cargo build -q --release -p diffrl-cli --locked
  DIFFRL="${CARGO_TARGET_DIR:-target}/release/diffrl"
fi
check=$(tools/venv.sh check)
serve=$(tools/venv.sh serve)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
GOAL=$goal VELOCITIES=$velocities "$check" tools/lang_first_actions.py extract "$dataset" "$tmp/frames.json"
"$serve" tools/lang_first_actions.py query "$DIFFRL" "$policy" "$tmp/frames.json"
if [ "${REFERENCE:-0}" = 1 ]; then
  "$check" tools/lang_first_actions.py reference "$dataset"
fi
