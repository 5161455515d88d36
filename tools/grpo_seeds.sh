#!/usr/bin/env bash
# Is GRPO's success gain on Push-T real? (docs/grpo.md) Fine-tunes one BC checkpoint once per
# arm and training seed with the embedded config (K' = 2, lr 3e-5, 30 iterations x 64 rollouts)
# plus the arm's changes, and evaluates BC and every fine-tuned policy on the same EPISODES
# seeded episodes (deterministic chain). Prints, per run and pooled per arm: success with its
# Wilson 95% interval, mean max score, the paired mean-max-score change against BC and the exact
# McNemar test on paired successes; draws OUT/curves.png (`diffrl plot`).
# Resumable: finished runs and evaluations are skipped.
#
# Usage: tools/grpo_seeds.sh [BC_POLICY] [OUT] [SEEDS...]
#   BC_POLICY  default runs/pusht/pretrain/policy (`diffrl run` makes it)
#   SEEDS      default 0 1 2 ([run].seed of each run; evaluation seeds stay [eval].seed)
# Environment: EPISODES (default 500), ITERATIONS (default: [grpo].iterations = 30),
# ARMS (default "grpo"):
#   grpo          the embedded config: outcome = max score + 1 on success, GRPO advantages
#   oprl          + OPRL implicit PRM ([grpo.implicit_prm] defaults), estimator grpo-process
#   grpo-process  estimator grpo-process on the environment's own step rewards (coverage): the
#                 control for oprl (same advantages, no implicit PRM)
#   success-dapo  outcome = success only, DAPO dynamic sampling of groups with a success
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/target_dir.sh
policy=${1:-runs/pusht/pretrain/policy}
out=${2:-runs/grpo_seeds}
shift $(( $# < 2 ? $# : 2 ))
seeds=("$@")
[ ${#seeds[@]} -eq 0 ] && seeds=(0 1 2)
episodes=${EPISODES:-500}
read -r -a arms <<< "${ARMS:-grpo}"
[ -f "$policy/policy.json" ] || { echo "no policy at $policy (run \`diffrl run\` first)" >&2; exit 2; }
cargo build --release -p diffrl-cli --locked
bin="${CARGO_TARGET_DIR:-target}/release/diffrl"
mkdir -p "$out/bc"
for arm in "${arms[@]}"; do
  case $arm in
    grpo) printf '' ;;
    oprl) printf '[grpo.advantage]\nestimator = "grpo-process"\n[grpo.implicit_prm]\n' ;;
    grpo-process) printf '[grpo.advantage]\nestimator = "grpo-process"\n' ;;
    success-dapo) printf '[reward]\noutcome = "success"\nsuccess_bonus = 0.0\n[grpo]\ndynamic_sampling = true\n' ;;
    *) echo "unknown arm $arm (grpo, oprl, grpo-process, success-dapo)" >&2; exit 2 ;;
  esac > "$out/$arm.toml"
done
iter_arg=()
[ -n "${ITERATIONS:-}" ] && iter_arg=(--iterations "$ITERATIONS")
[ -f "$out/bc/eval.json" ] || "$bin" eval --policy "$policy" --episodes "$episodes" --out "$out/bc/eval.json"
for arm in "${arms[@]}"; do
  for seed in "${seeds[@]}"; do
    dir="$out/$arm-$seed"
    [ -f "$dir/eval.json" ] && continue
    resume=()
    [ -d "$dir/train_state" ] && resume=(--resume)
    mkdir -p "$dir"
    start=$(date +%s)
    "$bin" grpo --config "$out/$arm.toml" --policy "$policy" --out "$dir" --seed "$seed" \
      --eval-episodes 0 "${iter_arg[@]}" "${resume[@]}" 2>&1 | tee -a "$dir/log.txt"
    echo "$arm seed $seed: $(( $(date +%s) - start )) s wall" | tee -a "$dir/log.txt"
    "$bin" eval --policy "$dir/policy" --episodes "$episodes" --out "$dir/eval.json"
  done
done
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
def mcnemar(b, c):
    # Exact two-sided: the discordant pairs are Binomial(b + c, 1/2) under no difference.
    n = b + c
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2 ** n)
def load(name):
    e = json.load(open(os.path.join(out, name, "eval.json")))
    return e, sorted(e["per_episode"], key=lambda r: (r["env"], r["episode"]))
bc, bc_eps = load("bc")
n = bc["episodes"]
lo, hi = wilson(bc["successes"], n)
print(f"{'run':18} {'success':>8} {'Wilson 95%':>13} {'mean max score':>15} {'paired score change (95%)':>27} {'only it/only BC':>16} {'McNemar p':>10}")
print(f"{'BC':18} {100*bc['successes']/n:7.1f}% {100*lo:5.1f}-{100*hi:5.1f}% {bc['mean_max_score']:15.3f}")
for arm in arms:
    tot_k = tot_n = 0
    for s in seeds:
        if not os.path.exists(os.path.join(out, f"{arm}-{s}", "eval.json")):
            continue
        e, eps = load(f"{arm}-{s}")
        assert [(r["env"], r["episode"]) for r in eps] == [(r["env"], r["episode"]) for r in bc_eps], "episodes differ"
        d = [g["max_score"] - b["max_score"] for g, b in zip(eps, bc_eps)]
        m = sum(d) / len(d)
        half = 1.96 * math.sqrt(sum((x - m) ** 2 for x in d) / (len(d) - 1)) / math.sqrt(len(d))
        b = sum(g["success"] and not o["success"] for g, o in zip(eps, bc_eps))
        c = sum(o["success"] and not g["success"] for g, o in zip(eps, bc_eps))
        lo, hi = wilson(e["successes"], n)
        print(f"{arm + ' seed ' + s:18} {100*e['successes']/n:7.1f}% {100*lo:5.1f}-{100*hi:5.1f}% {e['mean_max_score']:15.3f} {m:+10.3f} ({m-half:+.3f}..{m+half:+.3f}) {b:>8}/{c:<7} {mcnemar(b, c):10.2g}")
        tot_k += e["successes"]; tot_n += n
    if tot_n:
        lo, hi = wilson(tot_k, tot_n)
        print(f"{arm + ' pooled':18} {100*tot_k/tot_n:7.1f}% {100*lo:5.1f}-{100*hi:5.1f}%  ({tot_k}/{tot_n}; the seeds share the {n} evaluation starts)")
PY
