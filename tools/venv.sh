#!/usr/bin/env bash
# Creates (once) the pinned Python virtualenv used by tools/ scripts and prints its python path.
# Usage: PY=$(tools/venv.sh)   The venv lives in the cache so repeated runs are fast.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${DIFFRL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/diffrl}
venv="$cache/venv-pusht"
stamp="$venv/.requirements"
if [ ! -x "$venv/bin/python" ] || ! cmp -s "$here/requirements-pusht.txt" "$stamp"; then
  mkdir -p "$cache"
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install --disable-pip-version-check -q -r "$here/requirements-pusht.txt" >&2
  cp "$here/requirements-pusht.txt" "$stamp"
fi
echo "$venv/bin/python"
