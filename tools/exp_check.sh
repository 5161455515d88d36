#!/usr/bin/env bash
# The vectorised exp, tanh and erf of crates/policy/src/expf.rs, tanhf.rs and erff.rs against
# the functions they replace (the C library's `expf` and `tanhf`, the libm crate's `erff`) on
# every one of the 2^32 f32 inputs, for the dispatching function and each register width the
# CPU has (the ignored tests; the suite checks 2^22 inputs of each). About seven minutes in
# release mode.
# Usage: tools/exp_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/target_dir.sh
cargo test -p diffrl-policy --release --locked --lib -- --ignored \
  exp_matches_the_library_on_every_input tanh_matches_the_library_on_every_input \
  erf_matches_libm_on_every_input
