"""Checks `diffrl serve` against the real openpi client (openpi-client 0.1.2).

Usage: python tools/serve_check.py DIFFRL_BINARY POLICY_DIR
Starts the server on a free loopback port (twice: with an API key, then with a small message
limit), and checks: /healthz, the metadata map, action shape and dtype, same seed -> same
actions, error text frames for malformed msgpack / wrong shapes / NaN / missing keys / text
frames, that the connection (and others) keep serving after each, wrong API keys, oversized
frames, and a clean exit on SIGTERM. Exits non-zero with the failed check's message.
"""

import sys
import urllib.request

import msgpack
import numpy as np
import websockets.exceptions
import websockets.sync.client
from openpi_client import msgpack_numpy
from openpi_client.websocket_client_policy import WebsocketClientPolicy

import serve_check_lib
from serve_check_lib import Checks

BIN, POLICY = sys.argv[1], sys.argv[2]
KEY = "check-key"
check = Checks("serve_check")


def start(*extra):
    return serve_check_lib.start(check, BIN, POLICY, *extra)


def stop(proc):
    out = serve_check_lib.stop(check, proc)
    check("stopped:" in out, f"the server reports what it served: {out!r}")
    return out


proc, url = start("--api-key", KEY)
try:
    http = url.replace("ws://", "http://")
    with urllib.request.urlopen(http + "/healthz", timeout=5) as r:
        check(r.status == 200 and r.read() == b"ok\n", "GET /healthz answers 200 ok")

    client = WebsocketClientPolicy(host=url, api_key=KEY)
    meta = client.get_server_metadata()
    ta, da, to = meta["action_horizon"], meta["action_dim"], meta["obs_horizon"]
    ds = meta["observation"]["observation.state"]["shape"][-1]
    check(meta["server"] == "diffrl" and ta >= 1 and da == 2 and ds == 5, f"metadata: {meta}")
    check(meta["action"]["shape"] == [ta, da] and meta["action"]["dtype"] == "float32", "action spec")
    check(meta["fps"] == 10.0, "fps in the metadata")

    state = np.array([200.0, 300.0, 250.0, 260.0, 0.3], dtype=np.float32)
    out = client.infer({"observation.state": state})
    a = out["actions"]
    check(isinstance(a, np.ndarray) and a.shape == (ta, da) and a.dtype == np.float32,
          f"actions are float32 [Ta, Da]: {type(a)} {getattr(a, 'shape', None)} {getattr(a, 'dtype', None)}")
    check(np.isfinite(a).all() and (a >= -50).all() and (a <= 600).all(), f"actions in range: {a}")
    check(out["server_timing"]["infer_ms"] > 0, "server_timing.infer_ms")

    # A whole window, float64, openpi's slash spelling, an explicit seed: same seed, same answer.
    window = np.tile(state.astype(np.float64), (to, 1))
    r1 = client.infer({"observation/state": window, "seed": 7, "prompt": "push the T"})["actions"]
    r2 = client.infer({"observation.state": window, "seed": np.int64(7)})["actions"]
    check(np.array_equal(r1, r2), "same seed, same actions")

    # Bad requests: a text frame that says what is wrong; the client keeps working.
    def refused(obs, needle):
        serve_check_lib.refused(check, client, obs, needle, {"observation.state": state})

    refused({"observation.state": np.zeros(7, np.float32)}, "does not fit this policy")
    refused({"observation.state": np.array([1, np.nan, 2, 3, 4], np.float32)}, "NaN")
    refused({"state": state, "camera": np.zeros((2, 2, 3), np.uint8)}, "unknown keys received: state, camera")
    refused({"observation.state": "abc"}, "numeric array")
    refused({"observation.state": state, "seed": -3}, "seed")

    # Below the client: malformed msgpack and a text frame on a raw websocket.
    with websockets.sync.client.connect(url, compression=None, max_size=None,
                                        additional_headers={"Authorization": f"Api-Key {KEY}"}) as raw:
        msgpack_numpy.unpackb(raw.recv())
        raw.send(b"\x92\x01")
        reply = raw.recv()
        check(isinstance(reply, str) and "not valid msgpack" in reply, f"malformed msgpack: {reply!r}")
        raw.send("hello")
        reply = raw.recv()
        check(isinstance(reply, str) and "binary" in reply, f"text frame: {reply!r}")
        raw.send(msgpack.packb([1, 2, 3]))
        reply = raw.recv()
        check(isinstance(reply, str) and "map" in reply, f"not a map: {reply!r}")
        raw.send(msgpack_numpy.packb({"observation.state": state}))
        reply = msgpack_numpy.unpackb(raw.recv())
        check(reply["actions"].shape == (ta, da), "the raw connection still serves")

    # API keys.
    for bad in (None, "wrong"):
        try:
            WebsocketClientPolicy(host=url, api_key=bad)
        except websockets.exceptions.InvalidStatus as e:
            check(e.response.status_code == 401, f"api key {bad!r}: HTTP {e.response.status_code}")
        else:
            raise SystemExit(f"serve_check FAILED: api key {bad!r} was accepted")
    check(client.infer({"observation.state": state})["actions"].shape == (ta, da), "serving after refusals")
finally:
    served = stop(proc)

# A small message limit: an oversized frame gets a text error, then close code 1009; a second
# connection is unaffected.
proc, url = start("--max-message-mb", "0.01")
try:
    big = WebsocketClientPolicy(host=url)
    other = WebsocketClientPolicy(host=url)
    try:
        big.infer({"observation.state": state, "padding": np.zeros(100_000, np.uint8)})
    except RuntimeError as e:
        check("accepts messages up to 10485 bytes" in str(e), f"oversized frame: {e}")
    else:
        raise SystemExit("serve_check FAILED: an oversized frame was accepted")
    try:
        big._ws.recv(timeout=5)
    except websockets.exceptions.ConnectionClosed as e:
        check(e.rcvd is not None and e.rcvd.code == 1009, f"close code 1009: {e}")
    check(other.infer({"observation.state": state})["actions"].shape == (ta, da),
          "other connections serve after an oversized frame")
finally:
    stop(proc)

print(f"serve_check: {check.count} checks passed against openpi-client 0.1.2 ({served.strip()})")
