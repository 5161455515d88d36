#!/usr/bin/env bash
# The CPU vision-language-action policy (configs/vla.toml: 64 x 64 image through the patch
# encoder, instruction through the word-level Transformer encoder, proprioception, residual-MLP
# diffusion denoiser) on CPU: diffrl vs PyTorch (tools/bench_vla_torch.py), same network, same
# 10-step eta=1 DDIM chain, at 1 and 2 threads. Measurements: chain_b1 / chain_b64 (one policy
# call, raw observation to actions: encoders once, then the whole chain, batch 1 / 64) and
# train_b64 (one BC step at [pretrain] batch_size: encoders + denoiser forward, backward, AdamW).
# diffrl also reports train_b64_shards2 in its 2-thread runs, the step as `diffrl pretrain`
# runs it ([pretrain] threads = 2 shards on 2 threads), set against PyTorch's 2-thread step.
# Each (impl, threads) pair runs ROUNDS times, interleaved; the table shows medians of the
# per-run medians and torch/diffrl speedups (> 1: diffrl is faster). The script
# fails when the two networks' parameter counts or chain settings differ. Raw JSON lines go to
# ${OUT:-target/bench_vla.jsonl}.
# Run it on an otherwise idle machine: torch's OpenMP threads spin while they wait, so with
# other work on the cores the 2-thread numbers collapse (OMP_WAIT_POLICY=PASSIVE in the
# environment avoids that; each JSON line records the 1-minute load average).
# Usage: [CONFIG=configs/vla.toml] tools/bench_vla.sh [repeats=100] [rounds=1]
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/target_dir.sh
PY=$(tools/venv.sh torch)
repeats=${1:-100}
rounds=${2:-1}
out=${OUT:-target/bench_vla.jsonl}
mkdir -p "$(dirname "$out")"
: > "$out"

# configs/vla.toml has FiLM and sample prediction since 2026-11-27 (docs/vla.md's first speed
# table; for its table of the earlier network drop these two flags and those lines of the config).
# CONFIG (default configs/vla.toml) chooses the network; its image read-out is passed on to
# PyTorch (32 keypoints, the [policy.encoder.image] default, for kind = "patch-keypoints").
config=${CONFIG:-configs/vla.toml}
read_out=()
if grep -q '^kind = "patch-keypoints"' "$config"; then read_out=(--keypoints 32); fi
run_torch() { "$PY" tools/bench_vla_torch.py --threads "$1" --repeats "$repeats" --film --prediction sample "${read_out[@]}"; }

# ---- Rust side: `diffrl bench vla` prints the same JSON lines with "impl": "diffrl".
# Burn's Flex backend and diffrl run on rayon, so RAYON_NUM_THREADS sets the thread count.
cargo build --release --locked -q -p diffrl-cli
DIFFRL="${CARGO_TARGET_DIR:-target}/release/diffrl"
run_rust() { RAYON_NUM_THREADS="$1" "$DIFFRL" bench vla --config "$config" --repeats "$repeats"; }
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
def cell(v):
    return f"{v:10.3f}" if v is not None else f"{'-':>10}"
whats = ["chain_b1", "chain_b64", "train_b64", "train_b64_shards2"]
print(f"{'what':<17} {'threads':>7} {'torch ms':>10} {'diffrl ms':>10} {'speedup':>8}")
for what in whats:
    for threads in [1, 2]:
        # PyTorch has one way to run a step: its train_b64 at the same thread count.
        t = med("torch", "train_b64" if what.startswith("train_b64_shards") else what, threads)
        d = med("diffrl", what, threads)
        if t is None and d is None:
            continue
        sp = f"{t / d:7.2f}x" if t is not None and d is not None else f"{'-':>8}"
        print(f"{what:<17} {threads:>7} {cell(t)} {cell(d)} {sp}")
keys = ["params", "denoising_steps", "prediction", "film", "vocab"]
nets = {impl: {tuple(r.get(k) for k in keys) for r in rows if r["impl"] == impl} for impl in ("torch", "diffrl")}
for impl, n in nets.items():
    print(f"{impl}: " + "; ".join(", ".join(f"{k} {v}" for k, v in zip(keys, net)) for net in sorted(n, key=str)))
for impl in ("torch", "diffrl"):
    loads = [r["load1"] for r in rows if r["impl"] == impl and r.get("load1") is not None]
    if loads:
        print(f"1-min load average during the {impl} runs: {min(loads):.2f}-{max(loads):.2f}")
print(f"OMP_WAIT_POLICY={rows[0].get('omp_wait_policy', 'default')}")
if len(nets["torch"] | nets["diffrl"]) != 1:
    sys.exit("the two networks differ (above): change tools/bench_vla_torch.py's options to match the config")
PYEOF
echo "raw results: $out"
