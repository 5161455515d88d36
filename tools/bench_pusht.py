"""Times gym-pusht 0.1.8 env steps on one thread with the same workloads as `diffrl bench`.

Workloads: random = uniform targets in [0, 512]^2; push = block position + uniform(-20, 20).
Prints one JSON line per (obs, workload).
"""

import argparse
import json
import time

import gymnasium as gym
import gym_pusht  # noqa: F401
import numpy as np


def bench(obs_type, workload, steps, seed):
    env = gym.make("gym_pusht/PushT-v0", obs_type=obs_type)
    rng = np.random.default_rng(seed)
    episode = 0
    env.reset(seed=seed)
    inner = env.unwrapped
    resets = successes = 0
    start = time.perf_counter()
    for _ in range(steps):
        if workload == "random":
            a = rng.uniform(0, 512, size=2)
        else:
            a = np.asarray(inner.block.position) + rng.uniform(-20, 20, size=2)
        _, _, term, trunc, _ = env.step(a)
        if term or trunc:
            resets += 1
            successes += int(term)
            episode += 1
            env.reset(seed=seed + episode)
    secs = time.perf_counter() - start
    return {"impl": "gym-pusht", "obs": obs_type, "workload": workload, "steps": steps, "seconds": secs,
            "steps_per_s": steps / secs, "resets": resets, "successes": successes}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--obs", default="state")
    p.add_argument("--workload", default="random")
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    print(json.dumps(bench(a.obs, a.workload, a.steps, a.seed)))


if __name__ == "__main__":
    main()
