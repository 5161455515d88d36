#!/usr/bin/env bash
# Residual-MLP diffusion policy on CPU: diffrl vs PyTorch (tools/bench_policy_torch.py), same
# network (H=256, 3 blocks), same 10-step eta=1 DDIM chain, at 1 and 2 threads. Measurements:
# chain_b1 / chain_b64 (one whole chain, batch 1 / 64) and train_b256 (one AdamW step). Each
# (impl, threads) pair runs ROUNDS times, interleaved; the table shows medians of the per-run
# medians and torch/diffrl speedups. Raw JSON lines go to ${OUT:-target/bench_policy.jsonl}.
# Run it on an otherwise idle machine: torch's OpenMP threads spin while they wait, so with
# other work on the cores the 2-thread numbers collapse (OMP_WAIT_POLICY=PASSIVE in the
# environment avoids that; each JSON line records the policy and the 1-minute load average).
# Usage: tools/bench_policy.sh [repeats=200] [rounds=1]
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/target_dir.sh
PY=$(tools/venv.sh torch)
repeats=${1:-200}
rounds=${2:-1}
out=${OUT:-target/bench_policy.jsonl}
mkdir -p "$(dirname "$out")"
: > "$out"

run_torch() { "$PY" tools/bench_policy_torch.py --threads "$1" --repeats "$repeats"; }

# ---- Rust side: `diffrl bench policy` prints the same JSON lines with "impl": "diffrl".
# Burn's Flex backend and diffrl run on rayon, so RAYON_NUM_THREADS sets the thread count.
cargo build --release --locked -q -p diffrl-cli
DIFFRL="${CARGO_TARGET_DIR:-target}/release/diffrl"
run_rust() { RAYON_NUM_THREADS="$1" "$DIFFRL" bench policy --repeats "$repeats"; }
# --------------------------------------------------------------------------------------------

for _ in $(seq "$rounds"); do
  for threads in 1 2; do
    run_torch "$threads" >> "$out"
    run_rust "$threads" >> "$out"
  done
done

"$PY" - "$out" <<'PYEOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def med(impl, what, threads):
    v = [r["median_ms"] for r in rows if r["impl"] == impl and r["what"] == what and r["threads"] == threads]
    return statistics.median(v) if v else None
print(f"{'what':<11} {'threads':>7} {'torch ms':>10} {'diffrl ms':>10} {'speedup':>8}")
for what in ["chain_b1", "chain_b64", "train_b256"]:
    for threads in [1, 2]:
        t, d = med("torch", what, threads), med("diffrl", what, threads)
        ds = f"{d:10.3f}" if d is not None else f"{'-':>10}"
        sp = f"{t / d:7.2f}x" if t is not None and d is not None else f"{'-':>8}"
        print(f"{what:<11} {threads:>7} {t:10.3f} {ds} {sp}")
loads = [r["load1"] for r in rows if "load1" in r]
if loads:
    print(f"1-min load average during the torch runs: {min(loads):.2f}-{max(loads):.2f}"
          f" (OMP_WAIT_POLICY={rows[0].get('omp_wait_policy', 'default')})")
PYEOF
echo "raw results: $out"
