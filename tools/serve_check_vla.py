"""Checks `diffrl serve` with a vision-language-action policy (pixels + proprioception + an
instruction, lang-cubes) against the real openpi client (openpi-client 0.1.2).

Usage: python tools/serve_check_vla.py DIFFRL_BINARY POLICY_DIR
Checks: the metadata describes the camera image (uint8 [To, H, W, 3]), the state and the
required prompt with its vocabulary; an image + state + prompt request gets float32 [Ta, Da]
actions; same seed -> same actions; a missing, empty, unknown-word or over-long prompt and an
image of the wrong size each get a text error naming the problem, after which the connection
keeps serving. Exits non-zero with the failed check's message.
"""

import sys

import numpy as np
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from serve_check_lib import Checks, refused as refused_by, start, stop

BIN, POLICY = sys.argv[1], sys.argv[2]
check = Checks("serve_check_vla")

proc, url = start(check, BIN, POLICY)
try:
    client = WebsocketClientPolicy(host=url)
    meta = client.get_server_metadata()
    obs = meta["observation"]
    ta, da = meta["action_horizon"], meta["action_dim"]
    image = obs["observation.image"]
    h, w, c = image["shape"][-3:]
    check(image["dtype"] == "uint8" and c == 3, f"the camera image in the metadata: {image}")
    ds = obs["observation.state"]["shape"][-1]
    prompt = obs["prompt"]
    words = set(prompt["vocabulary"])
    check(prompt["required"] and {"the", "cube"} <= words and words & {"red", "green", "blue"},
          f"the prompt is required and its vocabulary (the demos' instructions) listed: {prompt}")
    # Any words of the vocabulary make a prompt the tokenizer accepts.
    colour = sorted(words & {"red", "green", "blue"})[0]
    text = f"the {colour} cube"

    rng = np.random.default_rng(0)
    frame = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
    state = rng.normal(size=ds).astype(np.float32)
    ask = {"observation.image": frame, "observation.state": state, "prompt": text}
    a = client.infer({**ask, "seed": 5})["actions"]
    check(isinstance(a, np.ndarray) and a.shape == (ta, da) and a.dtype == np.float32,
          f"actions are float32 [Ta, Da]: {getattr(a, 'shape', None)} {getattr(a, 'dtype', None)}")
    check(np.isfinite(a).all(), f"finite actions: {a}")
    check(np.array_equal(a, client.infer({**ask, "seed": 5})["actions"]), "same seed, same actions")

    def refused(request, needle):
        refused_by(check, client, request, needle, ask)

    without = {k: v for k, v in ask.items() if k != "prompt"}
    refused(without, "prompt: required")
    refused({**ask, "prompt": ""}, "empty")
    refused({**ask, "prompt": f"the zebra {colour} cube"}, "unknown word(s) 'zebra'")
    refused({**ask, "prompt": " ".join([text] * 20)}, "max_tokens")
    refused({**ask, "observation.image": np.zeros((h // 2, w // 2, 3), np.uint8)}, "observation.image")
finally:
    stop(check, proc)
print(f"serve_check_vla: {check.count} checks passed against openpi-client 0.1.2 (lang-cubes, image + prompt)")
