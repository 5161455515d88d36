# Sourced by tools/*.sh: reuse a Cargo target directory outside the clone when the machine has
# a writable cache, so repeated runs build incrementally; a clean machine builds from nothing.
# One directory per clone path: the names of a workspace crate's artifacts do not depend on the
# clone's path and their freshness is judged by file times, so a second clone sharing the
# directory can link artifacts built in the first, whose env!("CARGO_MANIFEST_DIR") (where the
# tabletop tasks find the Panda URDF) names the first clone's folder.
if [ -z "${CARGO_TARGET_DIR:-}" ]; then
  clone=$(pwd -P | cksum | cut -d' ' -f1)
  cache="${XDG_CACHE_HOME:-$HOME/.cache}/diffrl/target-$clone"
  if mkdir -p "$cache" 2>/dev/null && [ -w "$cache" ]; then export CARGO_TARGET_DIR="$cache"; fi
fi
