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
# Clippy compiles the workspace's crates for the test build itself (clippy-driver as Cargo's
# workspace wrapper, the way `cargo clippy` runs it, warnings as errors the way `cargo clippy
# -- -D warnings` asks it): the dependencies then build once, where a separate `cargo clippy`
# first checked all ~800 of them (7-8 minutes of a clean clone's CI on 2 cores). The cuda
# feature is on so the GPU path keeps compiling (CI has no GPU; nothing runs on it here).
driver=$(command -v clippy-driver || true)
if [ -z "$driver" ]; then
  echo "tools/test.sh: clippy-driver not found; install it with \`rustup component add clippy\`" >&2
  exit 1
fi
export RUSTC_WORKSPACE_WRAPPER="$driver"
export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
features=(--features diffrl-cli/cuda)
phase "build every target, linted by clippy (warnings are errors; --features cuda)"
cargo test --workspace --all-targets --locked --no-run "${features[@]}"
# The openpi and Rerun checks run the binary this build made.
export DIFFRL_BIN="${CARGO_TARGET_DIR:-target}/debug/diffrl"
# cargo-nextest (on the machine image) runs every test binary's tests side by side; plain
# cargo test where it is missing. Doc examples run through cargo test either way.
if cargo nextest --version >/dev/null 2>&1; then
  phase "cargo nextest run"
  cargo nextest run --workspace --locked "${features[@]}" --no-fail-fast --failure-output final --status-level fail
  phase "cargo test --doc"
  cargo test --workspace --doc --locked "${features[@]}"
else
  phase "cargo test"
  cargo test --workspace --locked "${features[@]}"
fi
phase "diffrl serve against the real openpi client (tools/serve_check.sh)"
bash tools/serve_check.sh
phase "recordings against the real Rerun tools (tools/rrd_check.sh)"
bash tools/rrd_check.sh
phase "done"
