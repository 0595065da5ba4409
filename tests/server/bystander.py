"""A bystander client, run as its own process while a test attacks the server.

It publishes a small message on its own subject every 20 ms and times how long the
server takes to deliver it back to it (it is subscribed): that delay is what an attack
costs everyone else. It prints one line of JSON with the delays when stdin closes or
after ``--seconds``. Also: :func:`rss_kib` and :class:`Bystander` (the test side).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from rawclient import RawClient

from migratory.model.message import Message
from migratory.protocol import ops

MAX_STALL_MS = 2000.0
"""The longest a bystander may wait for its own message during an attack: a liveness
bound, not a speed figure (a client held this long loses its connection to a 2 s
keep-alive, as the chaos clients use). The delays themselves are measured on a quiet
machine by ``benchmarks/attacks.py``; a 100 ms bound here failed on a busy box."""

SUBJECT = "/Bystander/Delay"
PERIOD = 0.02


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--token", default=None)
    args = parser.parse_args()
    client = RawClient(args.port, timeout=10.0)
    client.connect("bystander", token=args.token)
    client.subscribe(SUBJECT)
    client.recv_op()  # SUBSCRIBE_ALLOW
    print("ready", flush=True)
    delays: list[float] = []
    lost = 0
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        if select.select([sys.stdin], [], [], 0)[0]:
            break
        sent = time.monotonic()
        client.send_op(ops.Publish(Message(SUBJECT, str(sent).encode())))
        try:
            while True:
                op = client.recv_op(timeout=10.0)
                if isinstance(op, ops.Deliver) and op.messages[0].content == str(sent).encode():
                    break
            delays.append(time.monotonic() - sent)
        except TimeoutError:
            lost += 1
        time.sleep(max(0.0, PERIOD - (time.monotonic() - sent)))
    print(json.dumps({"delays": delays, "lost": lost}), flush=True)


class Bystander:
    """Runs :func:`main` in a process beside the test; ``stop()`` returns its figures."""

    def __init__(self, port: int, token: str | None = None) -> None:
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, __file__, str(port), *(["--token", token] if token else [])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line == b"ready\n", line

    def stop(self, *, at_least: float = 1.5) -> dict[str, Any]:
        """Stop (after ``at_least`` seconds of measuring) and return the figures."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        time.sleep(max(0.0, self.started + at_least - time.monotonic()))
        self.proc.stdin.write(b"stop\n")
        self.proc.stdin.close()
        result: dict[str, Any] = json.loads(self.proc.stdout.readline())
        self.proc.wait(10)
        delays = sorted(result["delays"])
        result["count"] = len(delays)
        result["max_ms"] = round(delays[-1] * 1000, 1) if delays else None
        result["p50_ms"] = round(delays[len(delays) // 2] * 1000, 1) if delays else None
        return result


if __name__ == "__main__":
    main()
