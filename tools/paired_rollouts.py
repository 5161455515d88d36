#!/usr/bin/env python3
"""Did a GRPO run move its own rollouts, or did the draws? (docs/vla.md)

Every GRPO iteration draws its initial states, instructions and chain noise from the run's seed
and the iteration's index, so two runs from the same policy and seed roll out the same episodes
until their policies differ. A run with `[grpo] lr = 1e-12` (the update runs, the policy does not
move) is then the paired control: per iteration, the trained run's rollout success and mean
episode length minus the frozen run's, averaged over windows of iterations with the standard
error of that mean (over the window's iterations).

Usage: tools/paired_rollouts.py FROZEN/metrics.jsonl RUN/metrics.jsonl [RUN2/metrics.jsonl ...]
Environment: WINDOW (iterations per window, default 10).
Only the Python standard library is needed.
"""

import json
import math
import os
import sys


def iterations(path):
    """Per GRPO iteration: (success rate, mean episode length) from a run's metrics.jsonl, whose
    episode and env-step counts are cumulative."""
    rows = []
    try:
        f = open(path, encoding="utf-8")
    except OSError as e:
        sys.exit(f"{path}: cannot read ({e.strerror})")
    with f:
        for n, line in enumerate(f, 1):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{n}: not JSON ({e})")
            train = rec.get("train")
            # Behaviour cloning's records carry "train" too; only the fine-tuning stages roll out.
            if train is None or rec.get("stage") not in ("grpo", "ppo"):
                continue
            try:
                rows.append((train["success_rate"], train["episodes"], train["env_steps"]))
            except KeyError as e:
                sys.exit(f"{path}:{n}: a fine-tuning record without {e}")
    if not rows:
        sys.exit(f"{path}: no GRPO or PPO iterations (records of stage \"grpo\" or \"ppo\")")
    out, prev = [], (0, 0)
    for success, episodes, steps in rows:
        e, s = episodes - prev[0], steps - prev[1]
        if e <= 0:
            sys.exit(f"{path}: the episode count does not grow at iteration {len(out) + 1}")
        out.append((success, s / e))
        prev = (episodes, steps)
    return out


def mean_se(values):
    m = sum(values) / len(values)
    if len(values) < 2:
        return m, float("nan")
    var = sum((v - m) ** 2 for v in values) / (len(values) - 1)
    return m, math.sqrt(var / len(values))


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__.strip().split("\n\n")[2])
    try:
        window = int(os.environ.get("WINDOW", "10"))
    except ValueError:
        sys.exit(f"WINDOW must be a whole number of iterations, not {os.environ['WINDOW']!r}")
    if window < 2:
        sys.exit("WINDOW must be at least 2 (a standard error needs two iterations)")
    frozen_path, runs = sys.argv[1], sys.argv[2:]
    frozen = iterations(frozen_path)
    loaded = [(path, iterations(path)) for path in runs]
    print(f"paired against {frozen_path} ({len(frozen)} iterations), windows of {window}:")
    print("  success: points, trained minus frozen; length: control steps per episode; mean +- se")
    for path, run in loaded:
        if run[0] != frozen[0]:
            print(
                f"  warning: {path}'s first iteration differs from the frozen run's "
                f"({run[0]} against {frozen[0]}): not the same draws (seed, config or policy)"
            )
        n = min(len(run), len(frozen))
        print(f"{path} ({len(run)} iterations, {n} paired)")
        if n < window:
            print(f"  fewer paired iterations than one window of {window}")
        for lo in range(0, n - window + 1, window):
            pairs = list(zip(run[lo : lo + window], frozen[lo : lo + window]))
            ds = mean_se([100 * (a[0] - b[0]) for a, b in pairs])
            dl = mean_se([a[1] - b[1] for a, b in pairs])
            own = sum(a[0] for a, _ in pairs) / window
            base = sum(b[0] for _, b in pairs) / window
            print(
                f"  iterations {lo + 1:3}-{lo + window:3}: success {100 * own:5.1f}% "
                f"(frozen {100 * base:5.1f}%) {ds[0]:+5.1f} +- {ds[1]:.1f}; "
                f"length {dl[0]:+6.2f} +- {dl[1]:.2f}"
            )


if __name__ == "__main__":
    main()
