"""A bystander client, run as its own process while a test attacks the server.

It publishes a small message on its own subject every 20 ms and waits for the server to
deliver it back to it (it is subscribed). The test marks when its attack starts
(:meth:`Bystander.attack_started`); from then on the bystander prints a line for each of
its messages published after the mark and delivered back: :meth:`Bystander.served_during_attack`
reads them, so a test shows that the others are still served *while* the attack is on --
a count, not a delay (speed is measured by ``benchmarks/attacks.py``, never asserted
here). It prints one line of JSON with its figures when stdin closes or after
``--seconds``. Also: :func:`rss_kib` and :class:`Bystander` (the test side).
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
from typing import IO, Any

sys.path.insert(0, str(Path(__file__).parent))

from rawclient import RawClient

from migratory.model.message import Message
from migratory.protocol import ops

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
    attack = False  # published after the test's "attack" line
    during = 0  # of those, delivered back
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        if select.select([sys.stdin], [], [], 0)[0]:
            line = sys.stdin.readline()
            if line != "attack\n":
                break  # "stop", or stdin closed
            attack = True
        after_mark = attack
        sent = time.monotonic()
        client.send_op(ops.Publish(Message(SUBJECT, str(sent).encode())))
        try:
            while True:
                op = client.recv_op(timeout=10.0)
                if isinstance(op, ops.Deliver) and op.messages[0].content == str(sent).encode():
                    break
            delays.append(time.monotonic() - sent)
            if after_mark:
                during += 1
                print(f"during {during}", flush=True)
        except TimeoutError:
            lost += 1
        time.sleep(max(0.0, PERIOD - (time.monotonic() - sent)))
    print(json.dumps({"delays": delays, "lost": lost}), flush=True)


class Bystander:
    """Runs :func:`main` in a process beside the test; ``stop()`` returns its figures."""

    def __init__(self, port: int, token: str | None = None, *, seconds: float = 120.0) -> None:
        self.started = time.monotonic()
        self.figures: dict[str, Any] = {}
        self.during = 0
        self.proc = subprocess.Popen(
            [sys.executable, __file__, str(port), *(["--token", token] if token else []),
             "--seconds", str(seconds)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,  # unbuffered: select() on stdout sees every line not yet read
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line == b"ready\n", line

    def _pipes(self) -> tuple[IO[bytes], IO[bytes]]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        return self.proc.stdin, self.proc.stdout

    def attack_started(self) -> None:
        """Mark the start of the attack: the bystander's later messages count."""
        stdin, _ = self._pipes()
        stdin.write(b"attack\n")
        stdin.flush()

    def served_during_attack(self, at_least: int = 0, timeout: float = 60.0) -> int:
        """How many of its messages published since :meth:`attack_started` the bystander
        got back so far; with ``at_least``, wait until it got that many (``timeout`` is a
        liveness limit: a bystander that gets nothing for a minute while the attacker
        holds on is not served)."""
        _, stdout = self._pipes()
        deadline = time.monotonic() + timeout
        while True:
            wait = max(0.0, deadline - time.monotonic()) if self.during < at_least else 0.0
            if not select.select([stdout], [], [], wait)[0]:
                break
            line = stdout.readline()
            if not line.startswith(b"during "):
                raise AssertionError(f"bystander: {line!r}")
            self.during = int(line.split()[1])
        assert self.during >= at_least, (self.during, at_least)
        self.figures["served_during_attack"] = self.during
        return self.during

    def stop(self, *, at_least: float = 1.5) -> dict[str, Any]:
        """Stop (after ``at_least`` seconds of measuring) and return the figures."""
        stdin, stdout = self._pipes()
        time.sleep(max(0.0, self.started + at_least - time.monotonic()))
        stdin.write(b"stop\n")
        stdin.close()
        line = stdout.readline()
        while line.startswith(b"during "):
            line = stdout.readline()
        result: dict[str, Any] = json.loads(line)
        self.proc.wait(10)
        delays = sorted(result["delays"])
        result["count"] = len(delays)
        result["max_ms"] = round(delays[-1] * 1000, 1) if delays else None  # printed only
        result["p50_ms"] = round(delays[len(delays) // 2] * 1000, 1) if delays else None
        self.figures.update(result)
        return self.figures


if __name__ == "__main__":
    main()
