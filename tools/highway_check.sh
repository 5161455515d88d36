#!/usr/bin/env bash
# Checks `diffrl sim drive kinematics|idm` against highway-env 1.12.1 from PyPI (pinned with its
# closure in tools/requirements-highway.txt, installed into a cached venv): random rollouts of
# `Vehicle.step` and random `IDMVehicle.acceleration` cases, to 1e-6 (docs/driving.md).
# Usage: tools/highway_check.sh [CASES]   (default 200; DIFFRL: a diffrl binary to use)
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/target_dir.sh
PY=$(tools/venv.sh highway)
if [ -z "${DIFFRL:-}" ]; then
  cargo build -q -p diffrl-cli --locked
  DIFFRL="${CARGO_TARGET_DIR:-target}/debug/diffrl"
fi
SDL_VIDEODRIVER=dummy PYGAME_HIDE_SUPPORT_PROMPT=1 "$PY" tools/highway_check.py "$DIFFRL" "${1:-200}"
