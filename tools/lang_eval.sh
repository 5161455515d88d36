#!/usr/bin/env bash
# Per-instruction evaluation of a lang-cubes policy (docs/tabletop.md, "Language suite"): each
# of the 21 instructions (18 trained, 3 held out) fixed in turn with `[env] instruction`, on
# EPISODES seeded episodes each, once as told and once with the language ablation
# (`[env] shuffle_text = true`: the observation tells an instruction drawn at random from the
# training set, success still follows the real one). Prints success per instruction with its
# Wilson 95% interval, the mean over the training instructions, the held-out ones, and both
# for the ablation. Every `diffrl eval` writes OUT/<mode>/<instruction>.json; finished ones are
# skipped, so an interrupted run resumes.
#
# Usage: tools/lang_eval.sh POLICY [OUT] [CONFIG]
#   POLICY  a lang-cubes policy folder (`diffrl pretrain` / `diffrl grpo` output)
#   OUT     default POLICY/../lang_eval
#   CONFIG  default configs/lang-cubes.toml; its [env] must hold the lines `instruction = ...`
#           and `shuffle_text = ...` (the shipped config does), which are replaced per run
# Environment: EPISODES (default 50), MODES (default "told shuffled"), DIFFRL (a diffrl binary
# to use instead of building one).
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/target_dir.sh
policy=${1:?usage: tools/lang_eval.sh POLICY [OUT] [CONFIG]}
out=${2:-$policy/../lang_eval}
config=${3:-configs/lang-cubes.toml}
episodes=${EPISODES:-50}
read -r -a modes <<< "${MODES:-told shuffled}"
[ -f "$policy/policy.json" ] || { echo "no policy at $policy" >&2; exit 2; }
for key in instruction shuffle_text; do
  grep -q "^$key = " "$config" || { echo "$config has no '$key = ' line to replace" >&2; exit 2; }
done
if [ -z "${DIFFRL:-}" ]; then
  cargo build --release -p diffrl-cli --locked
  DIFFRL="${CARGO_TARGET_DIR:-target}/release/diffrl"
fi

colors=(red green blue)
instructions=()
for x in "${colors[@]}"; do instructions+=("pick $x"); done
for x in "${colors[@]}"; do for y in "${colors[@]}"; do
  [ "$x" = "$y" ] || instructions+=("stack $x on $y")
done; done
for side in left right; do for x in "${colors[@]}"; do for y in "${colors[@]}"; do
  [ "$x" = "$y" ] || instructions+=("put $x $side of $y")
done; done; done

for mode in "${modes[@]}"; do
  case $mode in
    told) shuffle=false ;;
    shuffled) shuffle=true ;;
    *) echo "unknown mode $mode (told, shuffled)" >&2; exit 2 ;;
  esac
  mkdir -p "$out/$mode"
  for ins in "${instructions[@]}"; do
    file="$out/$mode/${ins// /_}.json"
    [ -f "$file" ] && continue
    cfg="$out/$mode/${ins// /_}.toml"
    sed -e "s/^instruction = .*/instruction = \"$ins\"/" \
        -e "s/^shuffle_text = .*/shuffle_text = $shuffle/" "$config" > "$cfg"
    echo "$mode: $ins" >&2
    "$DIFFRL" eval --config "$cfg" --policy "$policy" --episodes "$episodes" --out "$file" > /dev/null
  done
done

python3 - "$out" "${modes[@]}" <<'PYEOF'
import json, math, os, sys
out, modes = sys.argv[1], sys.argv[2:]
held_out = {"pick blue", "stack blue on red", "put green left of blue"}
def wilson(k, n, z=1.959963984540054):
    if n == 0:
        return (0.0, 0.0)
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (max(0.0, c - h), min(1.0, c + h))
def fmt(k, n):
    lo, hi = wilson(k, n)
    return f"{100 * k / n:5.1f}% ({100 * lo:4.1f}-{100 * hi:5.1f})"
rows = {}
for mode in modes:
    d = os.path.join(out, mode)
    for f in sorted(os.listdir(d)):
        if f.endswith(".json"):
            r = json.load(open(os.path.join(d, f)))
            rows.setdefault(f[:-5].replace("_", " "), {})[mode] = (r["successes"], r["episodes"])
print("| instruction | " + " | ".join(modes) + " |")
print("|---|" + "---|" * len(modes))
for ins in sorted(rows, key=lambda i: (i in held_out, i)):
    tag = " (held out)" if ins in held_out else ""
    print(f"| {ins}{tag} | " + " | ".join(fmt(*rows[ins][m]) if m in rows[ins] else "-" for m in modes) + " |")
for name, keep in [("training instructions", lambda i: i not in held_out), ("held-out instructions", lambda i: i in held_out)]:
    cells = []
    for m in modes:
        ks = [rows[i][m] for i in rows if keep(i) and m in rows[i]]
        k, n = sum(a for a, _ in ks), sum(b for _, b in ks)
        cells.append(fmt(k, n) if n else "-")
    print(f"| **{name}, pooled** | " + " | ".join(cells) + " |")
PYEOF
