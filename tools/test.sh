#!/usr/bin/env bash
# The project's test command (README, .ci/run): formatting, lints, and every test.
# Tests use tiny configs; learning experiments are tools/*_experiment.sh scripts, not tests.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/target_dir.sh
# Each phase's wall time, so a slow CI run says where its minutes went.
phase_start=$SECONDS
phase() {
  echo "   ($(( SECONDS - phase_start )) s)"
  phase_start=$SECONDS
  echo "== $1"
}
phase "cargo fmt --check"
cargo fmt --all -- --check
# One clippy pass with the cuda feature on: the GPU path must keep compiling (CI has no GPU),
# and checking the workspace once instead of twice saves CI a minute from a clean clone.
phase "cargo clippy --features cuda (warnings are errors)"
cargo clippy --workspace --all-targets --locked --features diffrl-cli/cuda -- -D warnings
# cargo-nextest (on the machine image) runs every test binary's tests side by side; plain
# cargo test where it is missing. Doc examples run through cargo test either way.
if cargo nextest --version >/dev/null 2>&1; then
  phase "cargo nextest run"
  cargo nextest run --workspace --locked --no-fail-fast --failure-output final --status-level fail
  phase "cargo test --doc"
  cargo test --workspace --doc --locked
else
  phase "cargo test"
  cargo test --workspace --locked
fi
phase "diffrl serve against the real openpi client (tools/serve_check.sh)"
bash tools/serve_check.sh
phase "recordings against the real Rerun tools (tools/rrd_check.sh)"
bash tools/rrd_check.sh
phase "done"
