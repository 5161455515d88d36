#!/usr/bin/env bash
# The scripted experts' success rates of docs/tabletop.md: the ignored (slow) tests of
# sims/tabletop/tests/expert_success.rs, in release mode: 100 episodes per tabletop task on two
# seed ranges, and 100 per lang-cubes instruction family. Prints one table line per task.
# Usage: tools/expert_success.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/target_dir.sh
cargo test -p diffrl-tabletop --release --locked --test expert_success -- --ignored --nocapture \
  --skip trace
