"""Writes gym-pusht 0.1.8 reference vectors for diffrl's parity tests.

Run through tools/pusht_vectors.sh (it creates the pinned virtualenv). The output,
assets/testdata/pusht_gym_vectors.json, is committed; the Rust tests need no Python.

Contents:
  coverage:   block poses (body origin x, y, angle) -> coverage, reward (shapely, as gym-pusht)
  keypoints:  block poses -> the 8 T corner points of obs_type="environment_state_agent_pos"
  resets:     reset_to_state inputs -> the state observation after reset (legacy quirk included)
  free_space: agent trajectories for random target sequences (the block is kept out of reach)
  pushes:     scripted straight pushes through the block -> block pose after every step
"""

import argparse
import json
import math

import gymnasium as gym
import gym_pusht  # noqa: F401  (registers the env)
import numpy as np


def make_env():
    return gym.make("gym_pusht/PushT-v0", obs_type="state").unwrapped


def set_block_pose(env, x, y, angle):
    # Angle first, then position: the body origin ends exactly at (x, y).
    env.block.angle = angle
    env.block.position = (x, y)


def coverage_cases(env, rng, n):
    out = []
    env.reset(seed=0)
    for i in range(n):
        if i % 2 == 0:  # anywhere in the arena
            x, y = rng.uniform(60, 450, size=2)
            a = rng.uniform(-math.pi, math.pi)
        else:  # near the goal, so coverage spans (0, 1]
            x, y = 256 + rng.normal(0, 15, size=2)
            a = math.pi / 4 + rng.normal(0, 0.25)
        set_block_pose(env, float(x), float(y), float(a))
        cov = env._get_coverage()
        reward = float(np.clip(cov / env.success_threshold, 0.0, 1.0))
        out.append({"pose": [float(x), float(y), float(a)], "coverage": float(cov), "reward": reward})
    return out


def keypoint_cases(env, rng, n):
    out = []
    env.reset(seed=0)
    for _ in range(n):
        x, y = rng.uniform(100, 400, size=2)
        a = rng.uniform(-math.pi, math.pi)
        set_block_pose(env, float(x), float(y), float(a))
        kp = env.get_keypoints(env._block_shapes).flatten()
        out.append({"pose": [float(x), float(y), float(a)], "keypoints": [float(v) for v in kp]})
    return out


def reset_cases(env, rng, n):
    out = []
    while len(out) < n:
        agent = rng.uniform(50, 450, size=2)
        block = rng.uniform(100, 400, size=2)
        a = rng.uniform(-math.pi, math.pi)
        state = [float(agent[0]), float(agent[1]), float(block[0]), float(block[1]), float(a)]
        obs, _ = env.reset(options={"reset_to_state": state})
        # Keep states whose agent is clear of the block: an overlapping agent is pushed out by
        # the one physics step inside reset, and that resolution is engine specific.
        if np.linalg.norm(obs[:2] - obs[2:4]) < 160:
            continue
        out.append({"init_state": state, "obs": [float(v) for v in obs]})
    return out


def free_space_cases(env, rng, n, steps):
    out = []
    for _ in range(n):
        agent = rng.uniform(50, 450, size=2)
        state = [float(agent[0]), float(agent[1]), 256.0, 256.0, 0.0]
        obs, _ = env.reset(options={"reset_to_state": state})
        # The block is removed from the space so the agent never touches it: pure PD dynamics.
        env.space.remove(env.block, *env.block.shapes)
        targets, agent_xy = [], []
        for _ in range(steps):
            if rng.uniform() < 0.5:  # far jump: high speeds
                t = rng.uniform(0, 512, size=2)
            else:  # small move
                t = np.clip(np.asarray(env.agent.position) + rng.normal(0, 30, size=2), 0, 512)
            t = [float(t[0]), float(t[1])]
            targets.append(t)
            env.step(np.array(t))
            agent_xy.append([float(env.agent.position[0]), float(env.agent.position[1])])
        out.append({"init_state": state, "reset_obs": [float(v) for v in obs], "targets": targets, "agent": agent_xy})
    return out


def push_cases(env, rng, n, steps):
    """Agent starts 80 px from the block centre and drives straight through it."""
    out = []
    for _ in range(n):
        bx, by = rng.uniform(180, 330, size=2)
        a = rng.uniform(-math.pi, math.pi)
        d = rng.uniform(-math.pi, math.pi)  # push direction
        start = [bx - 110 * math.cos(d), by - 110 * math.sin(d)]
        state = [start[0], start[1], float(bx), float(by), float(a)]
        obs, _ = env.reset(options={"reset_to_state": state})
        if np.linalg.norm(obs[:2] - obs[2:4]) < 80:
            continue
        speed = rng.uniform(15, 40)  # px per control step of the target
        targets, poses, cover = [], [], []
        for i in range(steps):
            t = [start[0] + (i + 1) * speed * math.cos(d), start[1] + (i + 1) * speed * math.sin(d)]
            t = [float(np.clip(t[0], 0, 512)), float(np.clip(t[1], 0, 512))]
            targets.append(t)
            o, r, term, trunc, info = env.step(np.array(t))
            poses.append([float(v) for v in o])
            cover.append(float(info["coverage"]))
        out.append({"init_state": state, "reset_obs": [float(v) for v in obs], "targets": targets, "obs": poses, "coverage": cover})
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="assets/testdata/pusht_gym_vectors.json")
    p.add_argument("--seed", type=int, default=20261122)
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    env = make_env()
    data = {
        "source": "gym-pusht==0.1.8 (tools/pusht_vectors.py --seed %d)" % args.seed,
        "coverage": coverage_cases(env, rng, 1200),
        "keypoints": keypoint_cases(env, rng, 50),
        "resets": reset_cases(env, rng, 50),
        "free_space": free_space_cases(env, rng, 12, 60),
        "pushes": push_cases(env, rng, 60, 12),
    }
    with open(args.out, "w") as f:
        json.dump(data, f, separators=(",", ":"))
    print("wrote", args.out, {k: len(v) for k, v in data.items() if isinstance(v, list)})


if __name__ == "__main__":
    main()
