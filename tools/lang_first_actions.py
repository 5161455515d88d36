"""How well a lang-cubes policy reproduces the expert's first actions (docs/vla.md).

Three steps, run by tools/lang_first_actions.sh in two pinned venvs:
  extract DATASET OUT.json   (check venv: pyarrow) frames 0..FRAMES-1 of the first EPISODES
                             episodes: the observation the configured environment would give
                             (recorded state without the instruction indices, optionally
                             without the joint velocities and with the goal's one-hot form),
                             the expert's action and the episode's task string
  query BIN POLICY IN.json   (serve venv: openpi-client) asks `BIN serve --policy POLICY` for
                             each frame's action chunk with the frame's own text, and prints
                             the mean absolute error of the first action per frame index
  reference DATASET          (check venv: numpy) the same error for a plain MLP (2 x 256 ReLU,
                             MSE on the first action's x and y, Adam 1e-3, STEPS steps of 256,
                             min-max inputs) trained on every frame of DATASET: what a
                             regression that sees the same inputs fits
Environment: EPISODES (120), FRAMES (3), GOAL (0/1: append the goal one-hot), VELOCITIES (1/0),
STEPS (10000), SEED (0).
"""

import json
import os
import subprocess
import sys

import numpy as np

# The layout of sims/tabletop/src/lang_cubes.rs: 43 observed values (joint positions 0..9,
# joint velocities 9..18, TCP 18..21, gripper 21, cube poses 22..43), then instruction_index
# and paraphrase_index.
OBSERVED = 43
VELOCITIES = range(9, 18)
INSTRUCTION_INDEX = 43
# INSTRUCTIONS of sims/tabletop/src/language.rs, in order: (family, moved cube, reference),
# colours 0 red, 1 green, 2 blue; families pick, stack, left-of, right-of.
INSTRUCTIONS = (
    [(0, c, None) for c in range(3)]
    + [(1, x, y) for x in range(3) for y in range(3) if x != y]
    + [(2, x, y) for x in range(3) for y in range(3) if x != y]
    + [(3, x, y) for x in range(3) for y in range(3) if x != y]
)


def env_flag(name, default):
    return os.environ.get(name, default) not in ("0", "false", "")


def one_hot(index):
    family, cube, reference = INSTRUCTIONS[index]
    v = [0.0] * 10
    v[family] = 1.0
    v[4 + cube] = 1.0
    if reference is not None:
        v[7 + reference] = 1.0
    return v


def read_frames(dataset):
    import glob

    import pyarrow.parquet as pq

    files = sorted(glob.glob(os.path.join(dataset, "data", "*", "*.parquet")))
    if not files:
        sys.exit(f"no parquet files under {dataset}/data")
    tables = [pq.read_table(f).to_pydict() for f in files]
    col = lambda k: np.concatenate([np.asarray(t[k]) for t in tables])  # noqa: E731
    tasks = pq.read_table(os.path.join(dataset, "meta", "tasks.parquet")).to_pydict()
    key = "task" if "task" in tasks else "__index_level_0__"
    names = dict(zip(tasks["task_index"], tasks[key]))
    return (
        col("observation.state").astype(np.float64),
        col("action").astype(np.float64),
        col("episode_index"),
        col("frame_index"),
        [names[i] for i in col("task_index")],
    )


def observe(state, goal, velocities):
    obs = [v for i, v in enumerate(state[:OBSERVED]) if velocities or i not in VELOCITIES]
    if goal:
        obs += one_hot(int(state[INSTRUCTION_INDEX]))
    return obs


def extract(dataset, out):
    states, actions, episodes, frames, texts = read_frames(dataset)
    if states.shape[1] != OBSERVED + 2:
        sys.exit(f"{dataset} holds {states.shape[1]}-d states, not lang-cubes' {OBSERVED + 2}")
    n_eps, n_frames = int(os.environ.get("EPISODES", 120)), int(os.environ.get("FRAMES", 3))
    goal, velocities = env_flag("GOAL", "0"), env_flag("VELOCITIES", "1")
    keep = sorted(set(episodes))[:n_eps]
    rows = [
        {
            "frame": int(frames[k]),
            "state": observe(states[k], goal, velocities),
            "action": actions[k].tolist(),
            "text": texts[k],
        }
        for k in range(len(states))
        if episodes[k] in keep and frames[k] < n_frames
    ]
    with open(out, "w") as f:
        json.dump(rows, f)


def report(errors, what="x, y, z, gripper"):
    print(f"frame  samples  mean |error| of the first action ({what})")
    for frame in sorted(errors):
        e = np.mean(errors[frame], axis=0)
        print(f"{frame:5d}  {len(errors[frame]):7d}  " + ", ".join(f"{v:.3f}" for v in e))


def query(binary, policy, path):
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    proc = subprocess.Popen(
        [binary, "serve", "--policy", policy, "--port", "0", "--quiet"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        url = next((w for w in line.split() if w.startswith("ws://")), None)
        if url is None:
            sys.exit(f"diffrl serve did not start: {line!r}")
        host, port = url[len("ws://"):].split(":")
        client = WebsocketClientPolicy(host=host, port=int(port))
        errors = {}
        with open(path) as f:
            rows = json.load(f)
        for row in rows:
            request = {
                "observation/state": np.asarray(row["state"], dtype=np.float32),
                "prompt": row["text"],
                "seed": 0,
                "reset": True,
            }
            first = np.asarray(client.infer(request)["actions"])[0]
            errors.setdefault(row["frame"], []).append(np.abs(first - np.asarray(row["action"])))
        report(errors)
    finally:
        proc.terminate()


def reference(dataset):
    states, actions, _, frames, _ = read_frames(dataset)
    x = np.array([observe(s, True, True) for s in states])
    lo, hi = x.min(0), x.max(0)
    span = np.where(hi > lo, hi - lo, 1.0)
    x = np.where(hi > lo, 2.0 * (x - lo) / span - 1.0, 0.0)
    y = actions[:, :2]
    rng = np.random.default_rng(int(os.environ.get("SEED", 0)))
    d = x.shape[1]
    w = [rng.normal(0, np.sqrt(2 / d), (d, 256)), rng.normal(0, np.sqrt(2 / 256), (256, 256)),
         rng.normal(0, np.sqrt(2 / 256), (256, 2))]
    b = [np.zeros(256), np.zeros(256), np.zeros(2)]
    params = w + b
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]

    def forward(inp):
        h1 = np.maximum(inp @ w[0] + b[0], 0)
        h2 = np.maximum(h1 @ w[1] + b[1], 0)
        return h1, h2, h2 @ w[2] + b[2]

    for step in range(int(os.environ.get("STEPS", 10000))):
        j = rng.integers(0, len(x), 256)
        h1, h2, out = forward(x[j])
        g = 2 * (out - y[j]) / len(j)
        d2 = (g @ w[2].T) * (h2 > 0)
        d1 = (d2 @ w[1].T) * (h1 > 0)
        grads = [x[j].T @ d1, h1.T @ d2, h2.T @ g, d1.sum(0), d2.sum(0), g.sum(0)]
        for k, (p, gk) in enumerate(zip(params, grads)):
            m[k] = 0.9 * m[k] + 0.1 * gk
            v[k] = 0.999 * v[k] + 0.001 * gk * gk
            p -= 1e-3 * (m[k] / (1 - 0.9 ** (step + 1))) / (
                np.sqrt(v[k] / (1 - 0.999 ** (step + 1))) + 1e-8)
    errors = {}
    for frame in range(int(os.environ.get("FRAMES", 3))):
        sel = frames == frame
        errors[frame] = list(np.abs(forward(x[sel])[2] - y[sel]))
    print("reference MLP trained on every frame of the dataset:")
    report(errors, "x, y")


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in ("extract", "query", "reference"):
        sys.exit(__doc__)
    {"extract": extract, "query": query, "reference": reference}[sys.argv[1]](*sys.argv[2:])
