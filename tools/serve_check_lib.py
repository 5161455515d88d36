"""Shared pieces of the `diffrl serve` checks (tools/serve_check*.py): counted checks that stop
the script with the failed one's message, and a server started on a free loopback port."""

import signal
import subprocess


class Checks:
    """`check(cond, what)` counts a passed check, or exits with `NAME FAILED: what`."""

    def __init__(self, name):
        self.name, self.count = name, 0

    def __call__(self, cond, what):
        if not cond:
            raise SystemExit(f"{self.name} FAILED: {what}")
        self.count += 1


def refused(check, client, request, needle, good):
    """`request` gets a text error that mentions `needle`, and the same connection then still
    answers the well-formed request `good` with actions of the same shape as before."""
    shape = client.infer(good)["actions"].shape
    try:
        client.infer(request)
    except RuntimeError as e:
        check(needle in str(e), f"error mentions {needle!r}: {e}")
    else:
        raise SystemExit(f"{check.name} FAILED: {needle!r} case was accepted: {request!r}")
    check(client.infer(good)["actions"].shape == shape, f"still serving after the {needle!r} error")


def start(check, binary, policy, *extra):
    """`diffrl serve` on a free port; returns the process and the ws:// address it prints."""
    proc = subprocess.Popen(
        [binary, "serve", "--policy", policy, "--port", "0", "--quiet", *extra],
        stdout=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    url = next((w for w in line.split() if w.startswith("ws://")), None)
    check(url is not None, f"the server prints its address: {line!r}")
    return proc, url


def stop(check, proc):
    """SIGTERM, then checks a clean exit; returns what the server printed."""
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=20)
    check(proc.returncode == 0, f"SIGTERM ends the server cleanly (rc {proc.returncode})")
    return out
