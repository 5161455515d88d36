"""Checks .rrd recordings written by diffrl with the real Rerun CLI (rerun-sdk 0.36.3).

Usage: rrd_check.py RERUN_EXE KIND=FILE.rrd [KIND=FILE.rrd ...]
KIND selects the entity paths the file must hold (pretrain, grpo, run, robustness, pixels);
`run` is a `diffrl run` recording: behaviour cloning, the GRPO stage and the final evaluations;
`pixels` a pixel policy's pretrain and evaluation on the tabletop.

For each file: `rerun rrd verify` must accept it, `rerun rrd stats` must read it, and
`rerun rrd print` must list every expected entity with its components. Prints one summary line
per file; exits non-zero on the first failure.
"""

import os
import re
import subprocess
import sys
from collections import defaultdict

COMMON = {
    "/log": ["TextLog:text"],
}
EVAL = {
    "/scene/block": ["LineStrips2D:strips"],
    "/scene/goal": ["LineStrips2D:strips"],
    "/scene/walls": ["LineStrips2D:strips"],
    "/scene/agent": ["Points2D:positions", "Points2D:radii"],
    "/scene/bounds": ["Boxes2D:half_sizes"],
    "/scene/actions/predicted": ["LineStrips2D:strips"],
    "/scene/actions/executed": ["LineStrips2D:strips"],
    "/chain/x": ["LineStrips2D:strips", "LineStrips2D:colors"],
    "/chain/logp": ["Scalars:scalars"],
    "/rewards/reward": ["Scalars:scalars"],
    "/eval/episodes": ["TextLog:text", "TextLog:level"],
    "/eval/summary": ["TextLog:text"],
}
EXPECTED = {
    "pretrain": {
        **COMMON,
        **EVAL,
        "/train/loss/bc": ["Scalars:scalars"],
        "/train/lr/lr": ["Scalars:scalars"],
        "/train/grad/norm": ["Scalars:scalars"],
    },
    "grpo": {
        **COMMON,
        **EVAL,
        "/rewards/advantage": ["Scalars:scalars"],
        "/groups/mean": ["Scalars:scalars"],
        "/groups/std": ["Scalars:scalars"],
        "/groups/zero_variance_frac": ["Scalars:scalars"],
        "/train/loss/surrogate": ["Scalars:scalars"],
        "/train/kl/approx": ["Scalars:scalars"],
        "/train/clip/frac": ["Scalars:scalars"],
        "/train/success/rollouts": ["Scalars:scalars"],
        "/train/reward/mean": ["Scalars:scalars"],
        "/train/lr/lr": ["Scalars:scalars"],
    },
    "robustness": {
        **COMMON,
        "/robustness/table": ["TextDocument:text", "TextDocument:media_type"],
        "/robustness/success_rate": ["BarChart:values"],
        "/robustness/mean_max_score": ["BarChart:values"],
    },
}

# A pixel policy's evaluation on the tabletop (lang-cubes from its camera): the 3-D scene, the
# policy's frame and where it looked (occlusion saliency).
EXPECTED["pixels"] = {
    **COMMON,
    "/pixels": ["Image:buffer", "Image:format"],
    "/scene3d/actions/predicted": ["LineStrips3D:strips"],
    "/saliency/frame": ["Image:buffer", "Image:format"],
    "/saliency/max": ["Scalars:scalars"],
    "/eval/episodes": ["TextLog:text", "TextLog:level"],
}

EXPECTED["run"] = {
    **EXPECTED["pretrain"],
    **EXPECTED["grpo"],
    "/rewards/progress": ["Scalars:scalars"],
}

CHUNK = re.compile(r"^Chunk\(\S+\) with (\d+) rows \(.*?\) - (\S+) - data columns: \[(.*)\]$")


def run(cmd):
    env = dict(os.environ, RERUN_ANALYTICS="0")
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p.stdout + p.stderr


def check(rerun, kind, path):
    run([rerun, "rrd", "verify", path])
    stats = run([rerun, "rrd", "stats", path])
    stat = dict(re.findall(r"^(num_chunks|num_entity_paths|num_rows) = (\d+)", stats, re.M))
    rows = defaultdict(int)
    components = defaultdict(set)
    for line in run([rerun, "rrd", "print", path]).splitlines():
        m = CHUNK.match(line.strip())
        if m:
            n, entity, cols = m.groups()
            rows[entity] += int(n)
            # Columns print as `Archetype:field`, or `/entity@Archetype:field` for send_columns.
            components[entity].update(c.split("@")[-1] for c in cols.split())
    missing = []
    for entity, comps in EXPECTED[kind].items():
        if rows[entity] == 0:
            missing.append(f"{entity} (absent)")
            continue
        for c in comps:
            if c not in components[entity]:
                missing.append(f"{entity} {c} (has {sorted(components[entity])})")
    if missing:
        sys.exit(f"FAIL: {path}: missing\n  " + "\n  ".join(missing))
    data = sorted(e for e in rows if not e.startswith(("/container", "/view", "/viewport")))
    print(
        f"ok: {os.path.basename(path)} ({kind}): rerun rrd verify passed; "
        f"{stat.get('num_chunks')} chunks, {stat.get('num_rows')} rows, "
        f"{len(data)} data entities, {os.path.getsize(path)} bytes; "
        f"{len(EXPECTED[kind])} expected entities present"
    )


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    rerun = sys.argv[1]
    for arg in sys.argv[2:]:
        kind, path = arg.split("=", 1)
        check(rerun, kind, path)


if __name__ == "__main__":
    main()
