#!/usr/bin/env bash
# Does progress shaping help GRPO on Push-T? (docs/reward.md) From one BC checkpoint and one
# progress model, for each seed: outcome-only GRPO (estimator grpo) vs GRPO on shaped step
# rewards (estimator process, r + gamma Phi(s') - Phi(s)), same iterations and rollouts; each
# run evaluated on the same 100 seeded episodes. Prints success and mean max score per arm with
# the mean over seeds and draws OUT/curves.png (training-rollout success and mean max score
# against environment steps, mean over seeds; `diffrl plot`). Resumable: finished runs are
# skipped.
#
# Usage: tools/shaping_experiment.sh [BC_POLICY] [PROGRESS_MODEL] [ITERATIONS=5] [OUT] [SEEDS...]
# Environment: ARMS (default "outcome shaped"; also "process" = the process estimator on the
# environment's own step rewards, the control for "shaped", and "spa" = the process estimator
# on SPA contributions from SPA_MODEL, `diffrl reward train --kind spa`); FT_STEPS (below).
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/target_dir.sh
policy=${1:-runs/pusht/pretrain/policy}
model=${2:-runs/pusht/reward/progress}
iters=${3:-5}
out=${4:-runs/shaping_experiment}
shift $(( $# < 4 ? $# : 4 ))
seeds=("$@")
[ ${#seeds[@]} -eq 0 ] && seeds=(0 1 2)
[ -f "$policy/policy.json" ] || { echo "no policy at $policy" >&2; exit 2; }
[ -f "$model/reward.json" ] || { echo "no progress model at $model (diffrl reward train)" >&2; exit 2; }
cargo build --release -p diffrl-cli --locked
bin="${CARGO_TARGET_DIR:-target}/release/diffrl"
mkdir -p "$out"
cp configs/pusht.toml "$out/outcome.toml"
cp configs/pusht.toml "$out/process.toml"
{ cat configs/pusht.toml; printf '\n[reward.shaping]\nmodel = "%s"\ngamma = 0.99\n' "$(cd "$model" && pwd)"; } > "$out/shaped.toml"
read -r -a arms <<< "${ARMS:-outcome shaped}"
if [[ " ${arms[*]} " == *" spa "* ]]; then
  [ -f "${SPA_MODEL:-}/reward.json" ] || { echo "ARMS has spa: set SPA_MODEL to a folder from \`diffrl reward train --kind spa\`" >&2; exit 2; }
  { cat configs/pusht.toml; printf '\n[reward.spa]\nmodel = "%s"\n' "$(cd "$SPA_MODEL" && pwd)"; } > "$out/spa.toml"
fi
# K' (FT_STEPS): 0 = all K = 10, the setting of docs/reward.md's table (the embedded config now uses 2).
for f in "$out"/{outcome,process,shaped,spa}.toml; do
  [ -f "$f" ] && sed -i "/^\[grpo\]$/,/^\[grpo.advantage\]$/ s/^ft_denoising_steps = .*/ft_denoising_steps = ${FT_STEPS:-0}/" "$f"
done
for seed in "${seeds[@]}"; do
  for arm in "${arms[@]}"; do
    dir="$out/$arm-$seed"
    [ -f "$dir/eval.json" ] && continue
    est=grpo
    [ "$arm" != outcome ] && est=process
    resume=()
    [ -d "$dir/train_state" ] && resume=(--resume)
    mkdir -p "$dir"
    "$bin" grpo --config "$out/$arm.toml" --policy "$policy" --out "$dir" --estimator "$est" --eval-episodes 100 \
      --iterations "$iters" --seed "$seed" "${resume[@]}" 2>&1 | tee -a "$dir/log.txt"
  done
done
# Success and mean max score of the training rollouts against environment steps, mean over seeds.
plot_args=()
for arm in "${arms[@]}"; do
  dirs=$(printf "$out/$arm-%s," "${seeds[@]}")
  plot_args+=("$arm=${dirs%,}")
done
"$bin" plot --out "$out/curves.png" "${plot_args[@]}"
python3 - "$out" "${arms[*]}" "${seeds[@]}" <<'PY'
import json, math, os, sys
out, arms, seeds = sys.argv[1], sys.argv[2].split(), sys.argv[3:]
def wilson(k, n, z=1.96):
    p = k / n
    c = (p + z * z / (2 * n)) / (1 + z * z / n)
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return c - h, c + h
for arm in arms:
    rows = []
    for s in seeds:
        p = os.path.join(out, f"{arm}-{s}", "eval.json")
        if os.path.exists(p):
            e = json.load(open(p))
            rows.append((s, e["success_rate"], e["ci95"], e["mean_max_score"], e["successes"], e["episodes"]))
    for s, sr, ci, mms, _, _ in rows:
        print(f"{arm:8} seed {s}: success {100*sr:5.1f}% ({100*ci[0]:.1f}-{100*ci[1]:.1f})  mean max score {mms:.3f}")
    if rows:
        k, n = sum(r[4] for r in rows), sum(r[5] for r in rows)
        lo, hi = wilson(k, n)
        print(f"{arm:8} pooled over {len(rows)} seeds: success {100*k/n:.1f}% ({k}/{n}, Wilson {100*lo:.1f}-{100*hi:.1f}), mean max score {sum(r[3] for r in rows)/len(rows):.3f}")
PY
