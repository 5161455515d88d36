# Sourced by tools/*.sh: reuse a Cargo target directory outside the clone when the machine has
# a writable cache, so repeated runs build incrementally; a clean machine builds from nothing.
if [ -z "${CARGO_TARGET_DIR:-}" ]; then
  cache="${XDG_CACHE_HOME:-$HOME/.cache}/diffrl/target"
  if mkdir -p "$cache" 2>/dev/null && [ -w "$cache" ]; then export CARGO_TARGET_DIR="$cache"; fi
fi
