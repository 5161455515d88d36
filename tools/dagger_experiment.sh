#!/usr/bin/env bash
# DAgger on Push-T (docs/policy.md): pusher demonstrations -> behaviour cloning -> ROUNDS rounds
# of (roll out the current policy, label its states with the expert, aggregate, continue
# training from the current policy). Every policy is evaluated on the same seeded episodes.
# Usage: tools/dagger_experiment.sh [OUT=runs/dagger_experiment] [CONFIG=<keypoint config>]
# Environment (defaults in brackets): DEMOS [200], NOISE (DART px) [10], BC_STEPS [20000],
# ROUNDS [3], ROUND_EPISODES [200], ROUND_STEPS [10000], EVAL_EPISODES [200].
# Resumable: finished steps are skipped when their output exists.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/target_dir.sh
out=${1:-runs/dagger_experiment}
config=${2:-}
DEMOS=${DEMOS:-200}
NOISE=${NOISE:-10}
BC_STEPS=${BC_STEPS:-20000}
ROUNDS=${ROUNDS:-3}
ROUND_EPISODES=${ROUND_EPISODES:-200}
ROUND_STEPS=${ROUND_STEPS:-10000}
EVAL_EPISODES=${EVAL_EPISODES:-200}
cargo build --release --locked -q -p diffrl-cli
DIFFRL="${CARGO_TARGET_DIR:-target}/release/diffrl"
mkdir -p "$out"
if [ -z "$config" ]; then
  config="$out/config.toml"
  # Keypoint observations (docs/policy.md: twice the success of 5-d states on these demos).
  printf '[env]\nobs = "keypoints"\n[pretrain]\neval_every = 0\n' >"$config"
fi
[ -d "$out/demos" ] || "$DIFFRL" demos pusht --config "$config" --episodes "$DEMOS" --seed 0 \
  --noise "$NOISE" --out "$out/demos"
[ -f "$out/round0/eval.json" ] || { rm -rf "$out/round0"; "$DIFFRL" pretrain --config "$config" \
  --dataset "$out/demos" --out "$out/round0" --steps "$BC_STEPS" --eval-episodes "$EVAL_EPISODES"; }
data="$out/demos"
for r in $(seq 1 "$ROUNDS"); do
  prev="$out/round$((r - 1))/policy"
  # Rollout seeds differ per round and from evaluation's ([eval].seed 1,000,000).
  [ -d "$out/data$r" ] || "$DIFFRL" demos pusht --config "$config" --dagger "$prev" --base "$data" \
    --episodes "$ROUND_EPISODES" --seed "$((100 + r))" --out "$out/data$r"
  data="$out/data$r"
  [ -f "$out/round$r/eval.json" ] || { rm -rf "$out/round$r"; "$DIFFRL" pretrain --config "$config" \
    --dataset "$data" --init "$prev" --out "$out/round$r" --steps "$ROUND_STEPS" \
    --eval-episodes "$EVAL_EPISODES"; }
done
python3 - "$out" "$ROUNDS" <<'PYEOF'
import json, sys
out, rounds = sys.argv[1], int(sys.argv[2])
print(f"{'round':>5} {'episodes in data':>16} {'success':>8} {'Wilson 95%':>13} {'mean max score':>15}")
for r in range(rounds + 1):
    e = json.load(open(f"{out}/round{r}/eval.json"))
    info = json.load(open(f"{out}/{'demos' if r == 0 else f'data{r}'}/meta/info.json"))
    lo, hi = e["ci95"]
    print(f"{r:>5} {info['total_episodes']:>16} {100 * e['success_rate']:7.1f}% "
          f"{100 * lo:5.1f}-{100 * hi:5.1f}% {e['mean_max_score']:15.3f}")
PYEOF
