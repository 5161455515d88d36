#!/usr/bin/env bash
# Load benchmark of `diffrl serve` on loopback (bounded: CLIENTS x REQUESTS requests, the
# server in its own process): in-process batch-1 inference vs one sequential client (the
# serving overhead at p50), then CLIENTS concurrent clients without batching (--max-batch 1)
# and with it (--max-batch 64, window 0). Prints one JSON line (also appended to
# ${OUT:-target/bench_serve.jsonl}).
# Usage: tools/bench_serve.sh [POLICY_DIR] [CLIENTS=32] [REQUESTS=200]
# Without POLICY_DIR it serves an untrained checkpoint of the default config (one BC step on the
# shipped dataset): timing does not depend on the weights.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/target_dir.sh
cargo build --release --locked -q -p diffrl-cli
DIFFRL="${CARGO_TARGET_DIR:-target}/release/diffrl"
policy=${1:-}
clients=${2:-32}
requests=${3:-200}
out=${OUT:-target/bench_serve.jsonl}
mkdir -p "$(dirname "$out")"
if [ -z "$policy" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  "$DIFFRL" pretrain --dataset assets/pusht_expert_200 --out "$tmp/bc" --steps 1 \
    --eval-episodes 0 > /dev/null
  policy="$tmp/bc/policy"
fi
"$DIFFRL" bench serve --policy "$policy" --clients "$clients" --requests "$requests" \
  --repeats 300 | tee -a "$out"
