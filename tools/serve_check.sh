#!/usr/bin/env bash
# Checks `diffrl serve` against the real openpi client (PyPI openpi-client 0.1.2, pinned in
# tools/requirements-serve.txt, installed into a cached venv): trains a tiny checkpoint on the
# shipped dataset (seconds), then runs tools/serve_check.py; then a tiny joint planner on
# highway-merge (a multi-agent policy) through tools/serve_check_planner.py, and a tiny pixel
# policy on lang-cubes (image + state + prompt) through tools/serve_check_vla.py. Called by
# tools/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/target_dir.sh
PY=$(tools/venv.sh serve)
# tools/test.sh names the binary its build made; run alone, the script builds one.
if [ -n "${DIFFRL_BIN:-}" ]; then
  bin="$DIFFRL_BIN"
else
  cargo build -q -p diffrl-cli --locked
  bin="${CARGO_TARGET_DIR:-target}/debug/diffrl"
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# tiny NAME: writes $tmp/NAME.toml, the task's own lines (stdin) followed by the run, horizon,
# chain and BC settings every check shares: a checkpoint trained in seconds.
tiny() {
  {
    cat
    cat <<TOML
[run]
name = "serve-check-$1"
runs_dir = "$tmp/runs"
threads = 1
[policy]
pred_horizon = 4
action_horizon = 2
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
TOML
  } > "$tmp/$1.toml"
}

# demos_and_bc NAME TASK: 3 expert episodes of TASK under $tmp/NAME.toml, then BC on them into
# $tmp/NAME (its policy in $tmp/NAME/policy).
demos_and_bc() {
  "$bin" demos "$2" --config "$tmp/$1.toml" --episodes 3 --out "$tmp/$1-demos" > /dev/null
  "$bin" pretrain --config "$tmp/$1.toml" --dataset "$tmp/$1-demos" --out "$tmp/$1" \
    --eval-episodes 0 > /dev/null
}

tiny pusht <<TOML
[env]
# The checks send 5-d states (the main job's keypoints would be 18 values).
obs = "state"
[policy.denoiser]
hidden = 16
blocks = 1
TOML
"$bin" pretrain --config "$tmp/pusht.toml" --dataset assets/pusht_expert_200 --out "$tmp/bc" \
  --eval-episodes 0 > /dev/null
"$PY" tools/serve_check.py "$bin" "$tmp/bc/policy"

# A multi-agent policy through the same client: a tiny joint planner on highway-merge.
tiny planner <<TOML
task = "highway-merge"
[policy.denoiser]
kind = "joint"
[policy.denoiser.planner]
d_model = 8
heads = 2
layers = 1
ff_dim = 8
TOML
demos_and_bc planner highway-merge
echo '[]' > "$tmp/none.json"
"$bin" sim highway-merge --config "$tmp/planner.toml" --seed 0 --actions "$tmp/none.json" --json \
  | head -n 1 > "$tmp/obs.json"
"$PY" tools/serve_check_planner.py "$bin" "$tmp/planner/policy" "$tmp/obs.json"

# A vision-language-action policy: a tiny pixel policy on lang-cubes, image + state + prompt.
tiny vla <<TOML
task = "lang-cubes"
[env]
obs = "pixels"
image_size = 16
max_episode_steps = 10
[policy.encoder.image]
channels = [4]
groups = 2
keypoints = 4
out_dim = 8
[policy.denoiser]
hidden = 16
blocks = 1
TOML
demos_and_bc vla lang-cubes
"$PY" tools/serve_check_vla.py "$bin" "$tmp/vla/policy"
