#!/usr/bin/env bash
# The vectorised exp of crates/policy/src/expf.rs against the C library's `expf` on every one
# of the 2^32 f32 inputs, for the dispatching function and each register width the CPU has
# (the ignored test; the suite checks 2^22 inputs). About two minutes in release mode.
# Usage: tools/exp_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/target_dir.sh
cargo test -p diffrl-policy --release --locked --lib -- --ignored exp_matches_the_library_on_every_input
