"""Checks `diffrl serve` with a multi-agent policy (the joint planner on highway-merge)
against the real openpi client (openpi-client 0.1.2).

Usage: python tools/serve_check_planner.py DIFFRL_BINARY POLICY_DIR OBS_JSON
OBS_JSON holds one observation of the task (`{"state": [...]}`, every agent's block stacked).
Checks: the metadata names the agents, their entity records and the denoiser; actions are
float32 [Ta, agents x 2]; same seed -> same actions; each agent's actions depend on its own
block; one agent's block alone is refused with a text error and the connection keeps serving.
Exits non-zero with the failed check's message.
"""

import json
import sys

import numpy as np
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from serve_check_lib import Checks, start, stop

BIN, POLICY, OBS = sys.argv[1], sys.argv[2], sys.argv[3]
check = Checks("serve_check_planner")

proc, url = start(check, BIN, POLICY)
try:
    client = WebsocketClientPolicy(host=url)
    meta = client.get_server_metadata()
    n, ta, da = meta["agents"], meta["action_horizon"], meta["action_dim"]
    ds = meta["observation"]["observation.state"]["shape"][-1]
    check(meta["denoiser"] == "joint" and n == 2 and da == 2 * n, f"metadata: {meta}")
    names = [g["name"] for g in meta["entities"]]
    check(names == ["lanes", "neighbours"], f"entity groups: {meta['entities']}")
    block = ds // n
    for g in meta["entities"]:
        check(g["offset"] + g["width"] * g["count"] <= block, f"group {g} fits an agent's block of {block}")

    state = np.array(json.load(open(OBS))["state"], dtype=np.float32)
    check(state.shape == (ds,), f"the observation has {ds} values: {state.shape}")
    a = client.infer({"observation.state": state, "seed": 3})["actions"]
    check(isinstance(a, np.ndarray) and a.shape == (ta, da) and a.dtype == np.float32,
          f"actions are float32 [Ta, agents x 2]: {getattr(a, 'shape', None)}")
    check(np.isfinite(a).all(), f"finite actions: {a}")
    b = client.infer({"observation.state": state, "seed": 3})["actions"]
    check(np.array_equal(a, b), "same seed, same actions")

    # Agent 1's actions follow agent 1's block: change only agent 0's block and agent 1's
    # answer moves through the inter-agent attention, not by accident of layout.
    moved = state.copy()
    moved[block:] += 0.5
    c = client.infer({"observation.state": moved, "seed": 3})["actions"]
    check(not np.array_equal(a[:, 2:], c[:, 2:]), "agent 1's actions depend on its own block")

    try:
        client.infer({"observation.state": state[:block]})
    except RuntimeError as e:
        check("does not fit this policy" in str(e), f"one agent's block is refused: {e}")
    else:
        raise SystemExit("serve_check_planner FAILED: one agent's block was accepted")
    check(client.infer({"observation.state": state})["actions"].shape == (ta, da),
          "still serving after the error")
finally:
    stop(check, proc)
print(f"serve_check_planner: {check.count} checks passed against openpi-client 0.1.2 (highway-merge joint planner)")
