#!/usr/bin/env bash
# Creates (once) a pinned Python virtualenv for tools/ scripts and prints its python path.
# Usage: PY=$(tools/venv.sh [NAME])  with NAME = pusht (default: gym-pusht peer), check
# (pandas/pyarrow readers), torch (PyTorch CPU + diffusers), serve (openpi-client) or rerun
# (the Rerun Viewer and CLI, rerun-sdk 0.36.3); the pins are tools/requirements-NAME.txt. The
# venv lives in the cache so repeated runs are fast, and is rebuilt when the pins change. A
# `# pip-options: ...` line in the pins file adds pip options (torch uses --no-deps: its file
# lists the whole closure, without the GPU-only wheels).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
name=${1:-pusht}
req="$here/requirements-$name.txt"
[ -f "$req" ] || { echo "no $req" >&2; exit 2; }
cache=${DIFFRL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/diffrl}
venv="$cache/venv-$name"
stamp="$venv/.requirements"
if [ ! -x "$venv/bin/python" ] || ! cmp -s "$req" "$stamp"; then
  mkdir -p "$cache"
  opts=$(sed -n 's/^# pip-options: //p' "$req")
  python3 -m venv "$venv" >&2
  # shellcheck disable=SC2086  # opts is a word list
  "$venv/bin/pip" install --disable-pip-version-check -q $opts -r "$req" >&2
  cp "$req" "$stamp"
fi
echo "$venv/bin/python"
