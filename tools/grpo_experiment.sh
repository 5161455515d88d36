#!/usr/bin/env bash
# Fine-tuning comparison on Push-T (docs/grpo.md): GRPO, Dr.GRPO, VG-GRPO and PPO from one BC
# checkpoint, each with the same sample budget ([grpo] iterations x groups x group_size
# rollouts), each evaluated on the same 100 seeded episodes as the checkpoint itself.
#
# Usage: tools/grpo_experiment.sh [BC_POLICY_DIR] [ITERATIONS] [OUT_DIR] [METHODS...]
#   BC_POLICY_DIR  default runs/pusht/pretrain/policy (`diffrl run` or `diffrl pretrain` makes it)
#   ITERATIONS     default: [grpo].iterations of configs/pusht.toml
#   METHODS        default: grpo dr-grpo vg-grpo ppo
# Environment: FT_STEPS = K', the fine-tuned denoising steps (default 0 = all K = 10, the setting
# of the table in docs/grpo.md; `diffrl run` and the embedded config use 2).
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/target_dir.sh
policy=${1:-runs/pusht/pretrain/policy}
iters=${2:-}
out=${3:-runs/grpo_experiment}
shift $(( $# < 3 ? $# : 3 ))
methods=("$@")
[ ${#methods[@]} -eq 0 ] && methods=(grpo dr-grpo vg-grpo ppo)
[ -f "$policy/policy.json" ] || { echo "no policy at $policy (run \`diffrl run\` or \`diffrl pretrain\` first)" >&2; exit 2; }
cargo build --release -p diffrl-cli --locked
bin="${CARGO_TARGET_DIR:-target}/release/diffrl"
mkdir -p "$out"
cfg="$out/experiment.toml"
printf '[grpo]\nft_denoising_steps = %s\n' "${FT_STEPS:-0}" > "$cfg"
iter_arg=()
[ -n "$iters" ] && iter_arg=(--iterations "$iters")
if [ ! -f "$out/bc/eval.json" ]; then
  mkdir -p "$out/bc"
  "$bin" eval --policy "$policy" --episodes 100 --out "$out/bc/eval.json" | tee "$out/bc/log.txt"
fi
for m in "${methods[@]}"; do
  [ -f "$out/$m/eval.json" ] && { echo "$m: done ($out/$m/eval.json)"; continue; }
  resume=()
  [ -d "$out/$m/train_state" ] && resume=(--resume)
  mkdir -p "$out/$m"
  start=$(date +%s)
  if [ "$m" = ppo ]; then
    "$bin" ppo --config "$cfg" --policy "$policy" --out "$out/$m" --eval-episodes 100 "${iter_arg[@]}" "${resume[@]}"
  else
    "$bin" grpo --config "$cfg" --policy "$policy" --out "$out/$m" --estimator "$m" --eval-episodes 100 "${iter_arg[@]}" "${resume[@]}"
  fi 2>&1 | tee -a "$out/$m/log.txt"
  echo "$m: $(( $(date +%s) - start )) s wall" | tee -a "$out/$m/log.txt"
done
python3 - "$out" "${methods[@]}" <<'PY'
import json, sys, os
out, methods = sys.argv[1], sys.argv[2:]
print(f"{'method':10} {'success':>8} {'Wilson 95% CI':>16} {'mean max score':>15} {'env steps':>10} {'minutes':>8}")
for m in ["bc"] + methods:
    p = os.path.join(out, m, "eval.json")
    if not os.path.exists(p):
        continue
    e = json.load(open(p))
    steps, minutes = "", ""
    mp = os.path.join(out, m, "metrics.jsonl")
    if os.path.exists(mp):
        lines = [json.loads(l)["train"] for l in open(mp) if '"train"' in l]
        if lines:
            steps, minutes = lines[-1]["env_steps"], f"{lines[-1]['elapsed_s'] / 60:.1f}"
    print(f"{m:10} {100 * e['success_rate']:7.1f}% {100 * e['ci95'][0]:7.1f}-{100 * e['ci95'][1]:5.1f}% {e['mean_max_score']:15.3f} {steps:>10} {minutes:>8}")
PY
