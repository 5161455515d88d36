#!/usr/bin/env bash
# The behaviour-cloning experiment of docs/policy.md: the default config (state observations,
# residual-MLP diffusion policy, K = 10 DDIM) trained on the shipped Push-T demos, evaluated
# every [pretrain].eval_every steps and at the end on [eval].episodes seeded episodes.
# Usage: tools/bc_experiment.sh [OUT=runs/bc_experiment] [extra `diffrl pretrain` flags...]
# Prints the learning curve (score and success vs. wall-clock minutes) from metrics.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/target_dir.sh
out=${1:-runs/bc_experiment}
shift || true
cargo build --release --locked -q -p diffrl-cli
DIFFRL="${CARGO_TARGET_DIR:-target}/release/diffrl"
rm -rf "$out"
start=$(date +%s)
"$DIFFRL" pretrain --dataset assets/pusht_expert_200 --out "$out" --eval-episodes 100 "$@"
echo "total wall time: $(( $(date +%s) - start )) s"
python3 - "$out" <<'PYEOF'
import json, sys
out = sys.argv[1]
rows = [json.loads(l) for l in open(f"{out}/metrics.jsonl")]
elapsed = {}
for r in rows:
    if "train" in r:
        elapsed[r["train"]["step"]] = r["train"]["elapsed_s"]
print(f"{'step':>6} {'minutes':>8} {'episodes':>8} {'success':>8} {'95% CI':>13} {'mean max score':>15}")
final = json.load(open(f"{out}/eval.json"))
evals = [r["eval"] for r in rows if "eval" in r]
last = max(elapsed)
evals.append({"step": last, "episodes": final["episodes"], "success_rate": final["success_rate"],
              "ci95": final["ci95"], "mean_max_score": final["mean_max_score"]})
for e in evals:
    lo, hi = e["ci95"]
    print(f"{e['step']:>6} {elapsed.get(e['step'], 0) / 60:8.2f} {e['episodes']:>8} "
          f"{100 * e['success_rate']:7.1f}% {100 * lo:5.1f}-{100 * hi:5.1f}% {e['mean_max_score']:15.3f}")
PYEOF
