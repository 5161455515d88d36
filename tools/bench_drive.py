"""Agent-steps/s of highway-env 1.12.1 on a scene the size of diffrl's highway-merge, one thread.

highway-v0 with 2 lanes, 2 controlled vehicles (MultiAgentAction of ContinuousAction,
[acceleration, steering]), 11 other vehicles (IDM + MOBIL), 15 Hz physics, 5 Hz control, no
rendering, kinematics observations; random actions, resets whenever an episode ends. Prints one
JSON line like `diffrl bench`'s, with agent_steps_per_s = steps/s x agents.
Usage: bench_drive.py STEPS SEED
"""

import json
import sys
import time

import gymnasium as gym
import highway_env  # noqa: F401  (registers the environments)
import numpy as np

steps, seed = int(sys.argv[1]), int(sys.argv[2])
agents = 2
env = gym.make(
    "highway-v0",
    config={
        "lanes_count": 2,
        "vehicles_count": 11,
        "controlled_vehicles": agents,
        "simulation_frequency": 15,
        "policy_frequency": 5,
        "duration": 10_000,
        "action": {
            "type": "MultiAgentAction",
            "action_config": {"type": "ContinuousAction"},
        },
        "observation": {
            "type": "MultiAgentObservation",
            "observation_config": {"type": "Kinematics"},
        },
        "offscreen_rendering": True,
    },
)
rng = np.random.default_rng(seed)
env.reset(seed=seed)
resets = 0
start = time.perf_counter()
for _ in range(steps):
    action = tuple(rng.uniform(-1, 1, size=2) * np.array([0.3, 0.05]) for _ in range(agents))
    _, _, terminated, truncated, _ = env.step(action)
    if terminated or truncated:
        env.reset(seed=int(rng.integers(1 << 31)))
        resets += 1
secs = time.perf_counter() - start
print(json.dumps({
    "impl": "highway-env", "steps": steps, "seconds": secs, "steps_per_s": steps / secs,
    "agent_steps_per_s": agents * steps / secs, "resets": resets,
    "vehicles": len(env.unwrapped.road.vehicles),
}))
