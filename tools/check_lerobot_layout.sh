#!/usr/bin/env bash
# Checks a dataset folder with pandas/pyarrow as LeRobot v3.0 reads it. Usage: DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
PY=$("$here/venv.sh" check)
exec "$PY" "$here/check_lerobot_layout.py" "$@"
