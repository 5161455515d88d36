#!/usr/bin/env bash
# GPU against CPU for the diffusion policy (docs/scale.md, "GPU"): `diffrl bench policy` at the
# default residual MLP (hidden 256, 3 blocks, 416k parameters) and at about 8x its parameters
# (hidden 724), timing one K = 10 chain at batch 1 to 4,096, one BC AdamW step at batch 256
# and one GRPO minibatch update over 2,048 (environment step, denoising step) pairs. JSON lines
# go to OUT/bench_<device>.jsonl and a table to stdout. Run the `cuda` half on the GPU machine
# with a binary built with `--features cuda`, the `cpu` half on the CPU machine to compare
# (cross-machine ratios: say which machines in the table).
# Usage: tools/bench_gpu.sh cuda|cpu [OUT=.] [REPEATS=30]
#   DIFFRL_BIN=path/to/diffrl to skip the build (e.g. a carried cuda binary).
set -euo pipefail
device=${1:?usage: tools/bench_gpu.sh cuda|cpu [OUT] [REPEATS]}
out=${2:-.}
repeats=${3:-30}
cd "$(dirname "$0")/.."
if [ -n "${DIFFRL_BIN:-}" ]; then
  BIN=$DIFFRL_BIN
else
  source tools/target_dir.sh
  features=()
  [ "$device" = cuda ] && features=(--features cuda)
  cargo build --release --locked -q -p diffrl-cli "${features[@]}"
  BIN=${CARGO_TARGET_DIR:-target}/release/diffrl
fi
mkdir -p "$out"
log=$out/bench_$device.jsonl
: > "$log"
if [ "$device" = cuda ]; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
fi
for hidden in 256 724; do
  "$BIN" bench policy --device "$device" --hidden "$hidden" --batches 1,64,256,1024,4096 \
    --pairs 2048 --repeats "$repeats" | tee -a "$log"
done
python3 - "$log" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(f"| parameters | measurement | {rows[0]['device']} (ms) |")
print("|---|---|---|")
for r in rows:
    extra = f" ({r['pairs_per_s']:,.0f} pairs/s)" if "pairs_per_s" in r else ""
    print(f"| {r['params']:,} | {r['what']} | {r['median_ms']:.2f}{extra} |")
PYEOF
