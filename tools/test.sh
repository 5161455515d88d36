#!/usr/bin/env bash
# The project's test command (README, .ci/run): formatting, lints, and every test.
# Slow learning experiments are #[ignore]d and run by their own tools/ scripts instead.
set -euo pipefail
cd "$(dirname "$0")/.."
# Reuse a target directory outside the clone when the machine has a cache, so a second run
# is incremental; a clean machine still builds from nothing.
if [ -z "${CARGO_TARGET_DIR:-}" ]; then
  cache="${XDG_CACHE_HOME:-$HOME/.cache}/diffrl/target"
  if mkdir -p "$cache" 2>/dev/null && [ -w "$cache" ]; then export CARGO_TARGET_DIR="$cache"; fi
fi
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy (warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo check --features cuda (the GPU path must keep compiling; CI has no GPU)"
cargo check -p diffrl-cli --features cuda --locked
echo "== cargo test"
cargo test --workspace --locked
