#!/usr/bin/env bash
# Pick-cube control steps/s on one core: diffrl vs MuJoCo on an equivalent arm-and-cube scene
# (tools/mujoco_tabletop/pick_cube.xml, timed by tools/bench_tabletop.py), plus camera frames/s
# at 64x64 beside MuJoCo's offscreen renderer (EGL on Mesa's llvmpipe, one thread).
# Workloads: ours `random` <-> MuJoCo `random`; ours `push` (scripted contact) <-> MuJoCo
# `expert-like` (scripted pick). diffrl runs each twice, with the arm as a multibody (the
# default) and on impulse joints (`--env arm_joints=impulse`). Each pair is timed ROUNDS times, MuJoCo and diffrl interleaved on
# the same core; the table shows medians and the median of the per-round ratios (ratios, not
# absolute numbers, are what carry across machines). The "physics only" column is MuJoCo's
# mj_step rate divided by SUBSTEPS: the control rate it would have with no Python around it.
# MuJoCo also renders at 128x128, for reference. If `diffrl bench pick-cube` fails (not built yet,
# or the build fails), MuJoCo's numbers are still printed, with a note.
# Raw JSON lines go to ${OUT:-target/bench_tabletop.jsonl}. SUBSTEPS (default 10) must equal
# diffrl's physics substeps per control step. DIFFRL_BIN=path uses that binary, unbuilt.
# On a machine without Mesa's EGL, it apt-get installs libegl1 libegl-mesa0 libgl1-mesa-dri
# (as root), which MuJoCo's headless renderer needs.
# Usage: tools/bench_tabletop.sh [rounds=3] [steps=2000]
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/target_dir.sh
PY=$(tools/venv.sh mujoco)
rounds=${1:-3}
steps=${2:-2000}
pixel_steps=$((steps / 4))
substeps=${SUBSTEPS:-10}
out=${OUT:-target/bench_tabletop.jsonl}
mkdir -p "$(dirname "$out")"
: > "$out"
pin() { if command -v taskset >/dev/null; then taskset -c 0 "$@"; else "$@"; fi; }

if ! ldconfig -p 2>/dev/null | grep -q libEGL_mesa && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "installing Mesa's EGL (libegl1 libegl-mesa0 libgl1-mesa-dri) for MuJoCo's headless renderer" >&2
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libegl1 libegl-mesa0 libgl1-mesa-dri; } >&2 \
    || echo "apt-get failed: MuJoCo's render rows will carry an error" >&2
fi

if [ -n "${DIFFRL_BIN:-}" ]; then
  BIN=$DIFFRL_BIN
else
  BIN=${CARGO_TARGET_DIR:-target}/release/diffrl
  cargo build --release --locked -q -p diffrl-cli || echo "cargo build failed: timing MuJoCo alone" >&2
fi
# diffrl's side runs when its `bench pick-cube` answers; its failure goes to the note, not the log.
diffrl_note=""
probe() { "$BIN" bench pick-cube "$@" --steps 2 > /dev/null 2> "$out.err" || { diffrl_note=$(head -c 300 "$out.err"); return 1; }; }
diffrl_state=0; diffrl_pixels=0
probe --workload random && diffrl_state=1
probe --obs pixels && diffrl_pixels=1

for pair in random:random push:expert-like; do
  ours=${pair%%:*}; peer=${pair#*:}
  for _ in $(seq "$rounds"); do
    pin "$PY" tools/bench_tabletop.py --workload "$peer" --steps "$steps" --substeps "$substeps" >> "$out"
    [ "$diffrl_state" = 1 ] && pin "$BIN" bench pick-cube --workload "$ours" --steps "$steps" >> "$out"
    [ "$diffrl_state" = 1 ] && pin "$BIN" bench pick-cube --workload "$ours" --steps "$steps" --env arm_joints=impulse >> "$out"
  done
done
for _ in $(seq "$rounds"); do
  pin "$PY" tools/bench_tabletop.py --render 64 --steps "$pixel_steps" --substeps "$substeps" >> "$out"
  [ "$diffrl_pixels" = 1 ] && pin "$BIN" bench pick-cube --obs pixels --steps "$pixel_steps" >> "$out"
  [ "$diffrl_pixels" = 1 ] && pin "$BIN" bench pick-cube --obs pixels --steps "$pixel_steps" --env arm_joints=impulse >> "$out"
  pin "$PY" tools/bench_tabletop.py --render 128 --steps "$pixel_steps" --substeps "$substeps" >> "$out"
done

"$PY" - "$out" "$diffrl_note" <<'PYEOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
note = sys.argv[2]
med = lambda xs: statistics.median(xs) if xs else None
fmt = lambda x: f"{x:.0f}" if x is not None else "-"

def ratio(peer, ours):
    if not ours:
        return "-"
    r = [b / a for a, b in zip(peer, ours)]
    return f"{statistics.median(r):.2f}x ({min(r):.2f}-{max(r):.2f}x)"

mj = [r for r in rows if r["impl"] == "mujoco"]
print(f"MuJoCo {mj[0]['mujoco']}, {mj[0].get('substeps')} substeps per control step, one core")
# diffrl's rows per arm joint model: the default multibody, and --env arm_joints=impulse.
joints = lambda r: "impulse" if "arm_joints=impulse" in r.get("env", []) else "multibody"
print(f"{'obs':<7} {'diffrl / mujoco workload':<25} {'arm joints':<10} {'mujoco steps/s':>15} {'physics only':>13} "
      f"{'diffrl steps/s':>15} {'diffrl/mujoco (median, min-max)':>32}")
for ours, peer in [("random", "random"), ("push", "expert-like")]:
    m = [r for r in mj if r.get("what") is None and r["workload"] == peer]
    ms = [r["steps_per_s"] for r in m]
    phys = med([r["mj_steps_per_s"] / r["substeps"] for r in m])
    for model in ("multibody", "impulse"):
        d = [r["steps_per_s"] for r in rows if r["impl"] == "diffrl" and r.get("obs") == "state"
             and r["workload"] == ours and joints(r) == model]
        print(f"{'state':<7} {ours + ' / ' + peer:<25} {model:<10} {fmt(med(ms)):>15} {fmt(phys):>13} "
              f"{fmt(med(d)):>15} {ratio(ms, d):>32}")
print()
print(f"{'camera':<8} {'arm joints':<10} {'mujoco frames/s':>16} {'mujoco steps/s':>15} {'diffrl steps/s':>15} "
      f"{'diffrl/mujoco steps':>22}")
for size in (64, 128):
    m = [r for r in mj if r.get("what") == "render" and r["size"] == size]
    errors = {r["error"] for r in m if "error" in r}
    if errors:
        print(f"{size}x{size}: MuJoCo rendered nothing: {'; '.join(errors)}")
        continue
    fs = [r["frames_per_s"] for r in m]
    ms = [r["steps_per_s"] for r in m]
    for model in (("multibody", "impulse") if size == 64 else ("-",)):
        d = [r["steps_per_s"] for r in rows if r["impl"] == "diffrl" and r.get("obs") == "pixels"
             and joints(r) == model]
        print(f"{str(size) + 'x' + str(size):<8} {model:<10} {fmt(med(fs)):>16} {fmt(med(ms)):>15} "
              f"{fmt(med(d)):>15} {ratio(ms, d):>22}")
if note or not any(r["impl"] == "diffrl" for r in rows):
    print(f"\nnote: `diffrl bench pick-cube` failed, so rows with '-' show MuJoCo's side only: {note.strip() or 'no output'}")
PYEOF
echo "raw results: $out"
