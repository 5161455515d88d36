#!/usr/bin/env bash
# Checks a dataset folder with pandas/pyarrow as LeRobot v3.0 reads it. Usage: DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${DIFFRL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/diffrl}
venv="$cache/venv-check"
if [ ! -x "$venv/bin/python" ] || ! cmp -s "$here/requirements-check.txt" "$venv/.requirements"; then
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install --disable-pip-version-check -q -r "$here/requirements-check.txt" >&2
  cp "$here/requirements-check.txt" "$venv/.requirements"
fi
exec "$venv/bin/python" "$here/check_lerobot_layout.py" "$@"
