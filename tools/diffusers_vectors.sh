#!/usr/bin/env bash
# Regenerates assets/testdata/diffusers_vectors.json from diffusers 0.42.1 (pinned torch venv).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(tools/venv.sh torch)
"$PY" tools/diffusers_vectors.py "$@"
