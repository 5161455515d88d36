"""Compares `diffrl sim drive kinematics|idm` with highway-env 1.12.1 (docs/driving.md).

Usage: highway_check.py DIFFRL [CASES]
Draws CASES (default 200) random kinematics rollouts and IDM cases from a fixed seed, runs
highway-env's `Vehicle.step` and `IDMVehicle.acceleration` on each and diffrl's CLI on the
same inputs, and fails when any value differs by more than 1e-6 (relative to max(1, |value|)).

highway-env side: vehicles on `RoadNetwork.straight_road_network(speed_limit=None)` (lanes
without a speed limit, so IDM's target speed is not clipped by the lane); the kinematics
vehicle is a plain `Vehicle` driven through `act({"steering", "acceleration"})` and `step(dt)`;
the IDM leader is a `Vehicle` `gap` metres ahead on the same lane, both heading along it.
"""

import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from highway_env.road.road import Road, RoadNetwork
from highway_env.vehicle.behavior import IDMVehicle
from highway_env.vehicle.kinematics import Vehicle

TOL = 1e-6


def road():
    return Road(RoadNetwork.straight_road_network(lanes=1, speed_limit=None))


def run(binary, *args):
    out = subprocess.run([binary, "sim", "drive", *args, "--json"], check=True,
                         capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines()]


def close(a, b):
    return abs(a - b) <= TOL * max(1.0, abs(b))


def main():
    binary = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    rng = np.random.default_rng(0)
    worst, failures = 0.0, []
    with tempfile.TemporaryDirectory() as tmp:
        # Kinematics: random start (speeds beyond +-40 m/s included, to exercise the clipping),
        # 20 random [steering, acceleration] pairs, random dt.
        for case in range(n):
            x, y = (float(v) for v in rng.uniform(-100, 100, 2))
            heading = float(rng.uniform(-np.pi, np.pi))
            speed = float(rng.uniform(-50, 50))
            dt = float(rng.choice([0.05, 0.1, 1 / 15, 0.2]))
            actions = [[float(rng.uniform(-0.6, 0.6)), float(rng.uniform(-8, 8))]
                       for _ in range(20)]
            path = os.path.join(tmp, "actions.json")
            with open(path, "w") as f:
                json.dump(actions, f)
            ours = run(binary, "kinematics", f"--state={x!r},{y!r},{heading!r},{speed!r}",
                       "--actions", path, f"--dt={dt!r}")
            v = Vehicle(road(), [x, y], heading, speed)
            theirs = [[v.position[0], v.position[1], v.heading, v.speed]]
            for steering, acceleration in actions:
                v.act({"steering": steering, "acceleration": acceleration})
                v.step(dt)
                theirs.append([v.position[0], v.position[1], v.heading, v.speed])
            if len(ours) != len(theirs):
                failures.append(f"kinematics case {case}: {len(ours)} lines, want {len(theirs)}")
                continue
            for step, (o, t) in enumerate(zip(ours, theirs)):
                for k in range(4):
                    worst = max(worst, abs(o["state"][k] - t[k]) / max(1.0, abs(t[k])))
                    if o["step"] != step or not close(o["state"][k], t[k]):
                        failures.append(f"kinematics case {case} step {step}: {o} vs {t}")
        # IDM: random speeds, targets (zero included), leaders (a quarter without one, gaps
        # down to 0 to exercise not_zero).
        cases = []
        for _ in range(n):
            case = {"speed": float(rng.uniform(-5, 40)),
                    "target_speed": float(rng.choice([0.0, rng.uniform(0, 40)])),
                    "front_speed": None, "gap": None}
            if rng.uniform() > 0.25:
                case["front_speed"] = float(rng.uniform(0, 40))
                case["gap"] = float(rng.choice([0.0, rng.uniform(0.001, 120)]))
            cases.append(case)
        path = os.path.join(tmp, "cases.json")
        with open(path, "w") as f:
            json.dump(cases, f)
        ours = run(binary, "idm", "--cases", path)
        for i, (c, o) in enumerate(zip(cases, ours)):
            r = road()
            lane = r.network.get_lane(("0", "1", 0))
            ego = IDMVehicle(r, lane.position(100.0, 0), 0.0, c["speed"])
            # Set after construction: the constructor reads a target of 0 as "keep the current
            # speed" (`target_speed or self.speed`).
            ego.target_speed = c["target_speed"]
            front = None
            if c["gap"] is not None:
                front = Vehicle(r, lane.position(100.0 + c["gap"], 0), 0.0, c["front_speed"])
            t = float(ego.acceleration(ego, front))
            worst = max(worst, abs(o["acceleration"] - t) / max(1.0, abs(t)))
            if not close(o["acceleration"], t):
                failures.append(f"idm case {i} {c}: {o['acceleration']} vs {t}")
        if len(ours) != len(cases):
            failures.append(f"idm: {len(ours)} lines for {len(cases)} cases")
    print(f"highway-env 1.12.1 vs diffrl: {n} kinematics rollouts of 20 steps, {n} IDM cases; "
          f"largest relative difference {worst:.2e} (tolerance {TOL:g})")
    if failures:
        print("\n".join(failures[:20]), file=sys.stderr)
        sys.exit(f"{len(failures)} mismatches")


if __name__ == "__main__":
    main()
