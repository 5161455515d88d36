#!/usr/bin/env bash
# Both cores for training: the BC step and the GRPO update on 1 thread against N threads
# (`[pretrain].threads`, `[grpo].threads`, and `[run].threads`: the environment workers, over
# which the rollouts' policy calls are cut too), on the embedded Push-T config, in interleaved
# rounds so that a machine's drift hits both sides alike. Prints one JSON line per round and
# the median speed-ups (also appended to ${OUT:-target/bench_threads.jsonl}).
#   BC:   steps/s of `diffrl pretrain` over BC_STEPS steps of batch 256 (steps / elapsed
#         seconds of the last metrics line; its steps_per_sec covers only the last interval).
#   GRPO: pairs/s of the update (forward + backward + AdamW over the (env step, denoising
#         step) pairs) and seconds per iteration, over ITERS iterations of 8 x 8 rollouts,
#         from a BC policy of BC_STEPS steps (update speed does not depend on its quality).
# Usage: tools/bench_threads.sh [ROUNDS=2] [N=2] [BC_STEPS=1000] [ITERS=2]
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/target_dir.sh
cargo build --release --locked -q -p diffrl-cli
DIFFRL="${CARGO_TARGET_DIR:-target}/release/diffrl"
rounds=${1:-2}
n=${2:-2}
bc_steps=${3:-1000}
iters=${4:-2}
out=${OUT:-target/bench_threads.jsonl}
mkdir -p "$(dirname "$out")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for t in 1 "$n"; do
  printf '[run]\nthreads = %s\n[pretrain]\nthreads = %s\neval_every = 0\n[grpo]\nthreads = %s\neval_every = 0\neval_episodes = 0\n' \
    "$t" "$t" "$t" > "$tmp/t$t.toml"
done
last() { tail -n 1 "$1"; }
for r in $(seq 1 "$rounds"); do
  for t in 1 "$n"; do
    "$DIFFRL" pretrain --config "$tmp/t$t.toml" --dataset assets/pusht_pusher_200 \
      --out "$tmp/bc$t-$r" --steps "$bc_steps" --eval-episodes 0 > /dev/null 2>&1
    "$DIFFRL" grpo --config "$tmp/t$t.toml" --policy "$tmp/bc1-1/policy" \
      --out "$tmp/grpo$t-$r" --iterations "$iters" --eval-episodes 0 > /dev/null 2>&1
    python3 - "$r" "$t" "$tmp/bc$t-$r/metrics.jsonl" "$tmp/grpo$t-$r/metrics.jsonl" <<'EOF' | tee -a "$out"
import json, sys
r, t, bc, grpo = sys.argv[1:]
bc_last = [json.loads(l) for l in open(bc) if '"train"' in l][-1]["train"]
its = [json.loads(l).get("train", {}) for l in open(grpo)]
its = [i for i in its if "update_pairs_per_s" in i]
upd = [i["update_pairs_per_s"] for i in its]
sec = [i["collect_s"] + i["update_s"] for i in its]
print(json.dumps({"round": int(r), "threads": int(t),
                  "bc_steps_per_s": round(bc_last["step"] / bc_last["elapsed_s"], 2),
                  "grpo_update_pairs_per_s": round(sum(upd) / len(upd), 1),
                  "grpo_s_per_iteration": round(sum(sec) / len(sec), 2)}))
EOF
  done
done
python3 - "$out" "$rounds" "$n" <<'EOF'
import json, statistics, sys
out, rounds, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows = [json.loads(l) for l in open(out)][-2 * rounds:]
def ratio(key, inverse=False):
    one = {r["round"]: r[key] for r in rows if r["threads"] == 1}
    many = {r["round"]: r[key] for r in rows if r["threads"] == n}
    rs = [(one[k] / many[k]) if inverse else (many[k] / one[k]) for k in one]
    return round(statistics.median(rs), 2)
print(f"speed-up of {n} threads over 1 (median of {rounds} rounds): "
      f"BC steps/s {ratio('bc_steps_per_s')}x, GRPO update pairs/s "
      f"{ratio('grpo_update_pairs_per_s')}x, GRPO iteration {ratio('grpo_s_per_iteration', True)}x")
EOF
