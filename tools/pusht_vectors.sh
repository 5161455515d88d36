#!/usr/bin/env bash
# Regenerates assets/testdata/pusht_gym_vectors.json from gym-pusht 0.1.8 (pinned venv).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(tools/venv.sh)
"$PY" tools/pusht_vectors.py "$@"
