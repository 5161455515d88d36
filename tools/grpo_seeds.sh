#!/usr/bin/env bash
# Is GRPO's success gain on Push-T real? (docs/grpo.md) The embedded config's GRPO (K' = 2,
# lr 3e-5, 30 iterations x 64 rollouts) from one BC checkpoint, once per training seed; BC and
# every fine-tuned policy evaluated on the same EPISODES seeded episodes (deterministic chain).
# Prints, per seed and pooled: success with its Wilson 95% interval, mean max score, the paired
# mean-max-score change against BC and the exact McNemar test on paired successes.
# Resumable: finished runs and evaluations are skipped.
#
# Usage: tools/grpo_seeds.sh [BC_POLICY] [OUT] [SEEDS...]
#   BC_POLICY  default runs/pusht/pretrain/policy (`diffrl run` makes it)
#   SEEDS      default 0 1 2 ([run].seed of each GRPO run; evaluation seeds stay [eval].seed)
# Environment: EPISODES (default 500), ITERATIONS (default: [grpo].iterations = 30).
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/target_dir.sh
policy=${1:-runs/pusht/pretrain/policy}
out=${2:-runs/grpo_seeds}
shift $(( $# < 2 ? $# : 2 ))
seeds=("$@")
[ ${#seeds[@]} -eq 0 ] && seeds=(0 1 2)
episodes=${EPISODES:-500}
[ -f "$policy/policy.json" ] || { echo "no policy at $policy (run \`diffrl run\` first)" >&2; exit 2; }
cargo build --release -p diffrl-cli --locked
bin="${CARGO_TARGET_DIR:-target}/release/diffrl"
mkdir -p "$out/bc"
iter_arg=()
[ -n "${ITERATIONS:-}" ] && iter_arg=(--iterations "$ITERATIONS")
[ -f "$out/bc/eval.json" ] || "$bin" eval --policy "$policy" --episodes "$episodes" --out "$out/bc/eval.json"
for seed in "${seeds[@]}"; do
  dir="$out/seed-$seed"
  [ -f "$dir/eval.json" ] && continue
  resume=()
  [ -d "$dir/train_state" ] && resume=(--resume)
  mkdir -p "$dir"
  start=$(date +%s)
  "$bin" grpo --policy "$policy" --out "$dir" --seed "$seed" --eval-episodes 0 \
    "${iter_arg[@]}" "${resume[@]}" 2>&1 | tee -a "$dir/log.txt"
  echo "seed $seed: GRPO $(( $(date +%s) - start )) s wall" | tee -a "$dir/log.txt"
  "$bin" eval --policy "$dir/policy" --episodes "$episodes" --out "$dir/eval.json"
done
python3 - "$out" "${seeds[@]}" <<'PY'
import json, math, os, sys
out, seeds = sys.argv[1], sys.argv[2:]
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
    k = min(b, c)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n)
def load(name):
    e = json.load(open(os.path.join(out, name, "eval.json")))
    key = lambda r: (r["env"], r["episode"])
    return e, sorted(e["per_episode"], key=key)
bc, bc_eps = load("bc")
n = bc["episodes"]
lo, hi = wilson(bc["successes"], n)
print(f"{'policy':10} {'success':>8} {'Wilson 95%':>14} {'mean max score':>15} {'paired score change (95%)':>27} {'only GRPO/only BC':>18} {'McNemar p':>10}")
print(f"{'BC':10} {100*bc['successes']/n:7.1f}% {100*lo:6.1f}-{100*hi:5.1f}% {bc['mean_max_score']:15.3f}")
tot_k, tot_n, tot_b, tot_c = 0, 0, 0, 0
for s in seeds:
    p = os.path.join(out, f"seed-{s}", "eval.json")
    if not os.path.exists(p):
        continue
    e, eps = load(f"seed-{s}")
    assert [(r["env"], r["episode"]) for r in eps] == [(r["env"], r["episode"]) for r in bc_eps], "episodes differ"
    d = [g["max_score"] - b["max_score"] for g, b in zip(eps, bc_eps)]
    m = sum(d) / len(d)
    sd = math.sqrt(sum((x - m) ** 2 for x in d) / (len(d) - 1))
    half = 1.96 * sd / math.sqrt(len(d))
    b = sum(g["success"] and not o["success"] for g, o in zip(eps, bc_eps))
    c = sum(o["success"] and not g["success"] for g, o in zip(eps, bc_eps))
    lo, hi = wilson(e["successes"], n)
    print(f"{'seed ' + s:10} {100*e['successes']/n:7.1f}% {100*lo:6.1f}-{100*hi:5.1f}% {e['mean_max_score']:15.3f} {m:+9.3f} ({m-half:+.3f}..{m+half:+.3f}) {b:>9}/{c:<8} {mcnemar(b, c):10.2g}")
    tot_k += e["successes"]; tot_n += n; tot_b += b; tot_c += c
if tot_n:
    lo, hi = wilson(tot_k, tot_n)
    print(f"pooled GRPO over {tot_n // n} seeds: {100*tot_k/tot_n:.1f}% ({tot_k}/{tot_n}, Wilson {100*lo:.1f}-{100*hi:.1f}); "
          f"discordant pairs {tot_b} only GRPO vs {tot_c} only BC")
PY
