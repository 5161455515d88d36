#!/usr/bin/env bash
# The project's test command (README, .ci/run): formatting, lints, and every test.
# Tests use tiny configs; learning experiments are tools/*_experiment.sh scripts, not tests.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/target_dir.sh
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy (warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo check --features cuda (the GPU path must keep compiling; CI has no GPU)"
cargo check -p diffrl-cli --features cuda --locked
echo "== cargo test"
cargo test --workspace --locked
echo "== diffrl serve against the real openpi client (tools/serve_check.sh)"
bash tools/serve_check.sh
echo "== recordings against the real Rerun tools (tools/rrd_check.sh)"
bash tools/rrd_check.sh
