#!/usr/bin/env bash
# Checks the recordings diffrl writes with the real Rerun tools (rerun-sdk 0.36.3, pinned with
# its closure in tools/requirements-rerun.txt, in a cached venv): the recording.rrd of a
# `diffrl run --quick` (every stage, about a minute), and a tiny pretrain (with its evaluation),
# GRPO, `eval --randomize` and a pixel policy's pretrain on the tabletop (its evaluation draws
# the saliency map), each with --rerun save=FILE; then `rerun rrd verify`,
# `rerun rrd stats` and the expected entity paths from `rerun rrd print` (tools/rrd_check.py).
# Called by tools/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/target_dir.sh
PY=$(tools/venv.sh rerun)
RERUN="$(dirname "$PY")/rerun"
export RERUN_ANALYTICS=0
"$RERUN" analytics disable > /dev/null 2>&1 || true
# tools/test.sh names the binary its build made; run alone, the script builds one.
if [ -n "${DIFFRL_BIN:-}" ]; then
  bin="$DIFFRL_BIN"
else
  cargo build -q -p diffrl-cli --locked
  bin="${CARGO_TARGET_DIR:-target}/debug/diffrl"
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/tiny.toml" <<TOML
[run]
name = "rrd-check"
runs_dir = "$tmp/runs"
threads = 1
[env]
max_episode_steps = 24
[policy]
pred_horizon = 4
action_horizon = 2
[policy.denoiser]
hidden = 16
blocks = 1
[policy.diffusion]
train_steps = 8
denoising_steps = 4
[pretrain]
steps = 20
batch_size = 16
warmup_steps = 2
log_every = 10
eval_every = 0
checkpoint_every = 20
[eval]
episodes = 2
envs = 2
[grpo]
groups = 2
group_size = 2
epochs = 1
minibatch = 64
iterations = 2
TOML
cat > "$tmp/sweep.toml" <<TOML
episodes = 2
[grid]
friction = [[1.0, 1.0]]
kp = [[60.0, 60.0]]
TOML
q() { "$@" > /dev/null; }
q "$bin" run --quick --out "$tmp/quick"
test -s "$tmp/quick/summary.json" && test -s "$tmp/quick/plots/grpo.png"
q "$bin" pretrain --config "$tmp/tiny.toml" --dataset assets/pusht_expert_200 --out "$tmp/bc" \
  --rerun "save=$tmp/pretrain.rrd"
q "$bin" grpo --config "$tmp/tiny.toml" --policy "$tmp/bc/policy" --out "$tmp/grpo" \
  --rerun "save=$tmp/grpo.rrd"
q "$bin" eval --config "$tmp/tiny.toml" --policy "$tmp/bc/policy" --randomize "$tmp/sweep.toml" \
  --out "$tmp" --rerun "save=$tmp/robustness.rrd"
# A pixel policy on the tabletop (one instruction, so that 8 demonstrations hold its words).
cat > "$tmp/pixels.toml" <<TOML
task = "lang-cubes"
[run]
threads = 1
[env]
obs = "pixels"
image_size = 16
max_episode_steps = 6
instruction = "pick red"
[policy]
pred_horizon = 4
action_horizon = 2
[policy.encoder.image]
kind = "patches"
[policy.denoiser]
hidden = 16
blocks = 1
[policy.diffusion]
train_steps = 8
denoising_steps = 4
[pretrain]
steps = 4
batch_size = 8
warmup_steps = 1
eval_every = 0
checkpoint_every = 4
[eval]
episodes = 1
envs = 1
TOML
q "$bin" demos lang-cubes --config "$tmp/pixels.toml" --episodes 8 --out "$tmp/pixel-demos"
q "$bin" pretrain --config "$tmp/pixels.toml" --dataset "$tmp/pixel-demos" --out "$tmp/pixel-bc" \
  --rerun "save=$tmp/pixels.rrd"
"$PY" tools/rrd_check.py "$RERUN" "run=$tmp/quick/recording.rrd" "pretrain=$tmp/pretrain.rrd" "grpo=$tmp/grpo.rrd" \
  "robustness=$tmp/robustness.rrd" "pixels=$tmp/pixels.rrd"
