#!/usr/bin/env python3
"""Where a fan-out message's latency goes: the server's own timeline beside the subscribers'.

Runs ``migratory bench fanout`` (default: 1,000 subscribers of one subject, 5 msg/s, the
latency floor of issue 13) against a server started by this script with probes in it.
The bench publisher puts ``monotonic_ns`` at the start of every content (``@@TS``
stamps), and ``CLOCK_MONOTONIC`` is one clock for every process on the machine, so the
server can say, per message, how long after the publisher's stamp it

- had decoded the publish (``Hub.publish`` entered),
- had fanned it out into every subscriber's outbox (``Hub.publish`` returned),
- finished its first, median and last ``send`` carrying that message,

and the subscribers' figure (the bench's ``publish -> receive``) shows what the load
generator adds after the server's write. Also: the trio thread's CPU per connection in
the idle-write sweep (``Server.write_urgent``, sweeps of >= 100 connections).

    .venv/bin/python benchmarks/fanout_floor.py [--subscribers 1000] [--rate 5]
        [--duration 15] [--set Key=Value ...] [--json out.json]

Meant for low rates: the first 2,000 messages are followed. The probes cost ~1-2 us per
write (a regex over the first bytes of each batch): compare the parts, not the absolute
CPU. Server mode (``--serve``, used by the script itself): ``python -m cluster serve
ARGS`` with the probes, summary written to ``$FANOUT_FLOOR_OUT`` at exit.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import re
import runpy
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

STAMP = re.compile(rb"@@TS(\d{19})")
MAX_MESSAGES = 2000  # messages followed (every write's time is kept: a tool for low rates)
UNLIMITED = ["MaxConnectionsPerAddress=0", "MaxHandshakesPerAddress=0", "MaxPublishesPerSecond=0",
             "MaxConnectionRatePerAddress=0", "MaxTlsHandshakeRate=0"]

# --- server side: the probes -------------------------------------------------------

_messages: dict[int, list[int]] = {}  # stamp -> [decoded, fanned out, write times...]
_sweeps: list[float] = []  # thread CPU per connection of each large idle-write sweep, us
_taken: list[int] = []  # the stamp of the batch being written (set by Outbox.take)


def _install_probes() -> None:
    from migratory.model import outbox
    from migratory.server import app, connection, hub

    mono = time.monotonic_ns
    publish, take, write = hub.Hub.publish, outbox.Outbox.take, connection.Connection._write
    write_urgent = app.Server.write_urgent

    def probed_publish(self: Any, message: Any, now: float) -> Any:
        started = mono()
        positioned = publish(self, message, now)
        found = STAMP.match(message.content)
        if found and len(_messages) < MAX_MESSAGES:
            _messages[int(found[1])] = [started, mono()]
        return positioned

    def probed_take(self: Any) -> bytes:
        batch: bytes = take(self)
        found = STAMP.search(batch, 0, 256)
        _taken[:] = [int(found[1])] if found else []
        return batch

    def probed_write(self: Any) -> bool:
        _taken.clear()
        done: bool = write(self)
        if _taken and _taken[0] in _messages:
            _messages[_taken[0]].append(mono())
        return done

    def probed_write_urgent(self: Any) -> None:
        count = len(self.urgent)
        started = time.thread_time_ns()
        write_urgent(self)
        if count >= 100:
            _sweeps.append((time.thread_time_ns() - started) / count / 1000)

    hub.Hub.publish = probed_publish  # type: ignore[method-assign]
    outbox.Outbox.take = probed_take  # type: ignore[method-assign]
    connection.Connection._write = probed_write  # type: ignore[method-assign]
    app.Server.write_urgent = probed_write_urgent  # type: ignore[method-assign]


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _summary() -> dict[str, Any]:
    """Per message, ms after its stamp: medians and p90 over the messages."""
    parts: dict[str, list[float]] = {
        "decoded": [], "fanned_out": [], "first_write": [], "median_write": [],
        "last_write": [], "sweep": [],
    }
    every_write: list[float] = []
    for stamp, times in _messages.items():
        decoded, fanned, writes = times[0], times[1], sorted(times[2:])
        if not writes:
            continue
        ms = [(t - stamp) / 1e6 for t in writes]
        every_write += ms
        parts["decoded"].append((decoded - stamp) / 1e6)
        parts["fanned_out"].append((fanned - stamp) / 1e6)
        parts["first_write"].append(ms[0])
        parts["median_write"].append(ms[len(ms) // 2])
        parts["last_write"].append(ms[-1])
        parts["sweep"].append(ms[-1] - ms[0])
    return {
        "messages": len(parts["sweep"]),
        "writes": len(every_write),
        "per_message_ms": {
            k: {"p50": _quantile(v, 0.5), "p90": _quantile(v, 0.9)} for k, v in parts.items()
        },
        "every_write_ms": {q: _quantile(every_write, v) for q, v in
                           (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))},
        "sweep_cpu_us_per_connection": _quantile(_sweeps, 0.5),
        "sweeps": len(_sweeps),
    }


def _serve(args: list[str]) -> None:
    _install_probes()
    out = os.environ.get("FANOUT_FLOOR_OUT", "fanout_floor.json")

    def write_summary() -> None:
        Path(out).write_text(json.dumps(_summary()))

    atexit.register(write_summary)
    sys.argv = ["cluster", *args]
    runpy.run_module("cluster", run_name="__main__", alter_sys=True)


# --- driver -----------------------------------------------------------------------


def _report(summary: dict[str, Any]) -> None:
    print(f"\nserver timeline ({summary['messages']} messages, {summary['writes']} writes), "
          "ms after the publisher's stamp, median over messages (p90):")
    for name, figure in summary["per_message_ms"].items():
        print(f"  {name:13s}: {figure['p50']:7.2f} ({figure['p90']:.2f})")
    every = summary["every_write_ms"]
    print(f"  every write  : p50 {every['p50']:.2f}, p90 {every['p90']:.2f}, "
          f"p99 {every['p99']:.2f}")
    print(f"idle-write sweep CPU per connection: {summary['sweep_cpu_us_per_connection']:.2f} us "
          f"(median of {summary['sweeps']} sweeps)")


def main() -> int:
    if sys.argv[1:2] == ["--serve"]:
        _serve(sys.argv[2:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subscribers", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=5.0)
    parser.add_argument("--duration", type=float, default=15.0)
    parser.add_argument("--set", action="append", default=[], metavar="Key=Value")
    parser.add_argument("--json", metavar="FILE")
    options = parser.parse_args()
    if any(s.split("=", 1)[0] == "Workers" and s != "Workers=1" for s in options.set):
        parser.error("one server process only: the probes live in the process this starts")
    from migratory.bench.server_process import ServerProcess

    class ProbedServer(ServerProcess):
        def command(self) -> list[str]:
            command = super().command()
            return [sys.executable, __file__, "--serve", *command[3:]]

    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "summary.json"
        os.environ["FANOUT_FLOOR_OUT"] = str(out)
        server = ProbedServer("fanout_floor", [*UNLIMITED, *options.set])
        with server:
            bench = [
                sys.executable, "-m", "migratory.bench", "fanout",
                "--url", f"ws://{server.host}:{server.port}", "--pid", str(server.pid),
                "--subscribers", str(options.subscribers), "--rate", str(options.rate),
                "--duration", str(options.duration), "--no-progress",
            ]
            code = subprocess.run(bench, timeout=options.duration + 120).returncode
        for _ in range(50):  # written at the server's exit
            if out.exists():
                break
            time.sleep(0.1)
        if not out.exists():
            print(f"no probe summary (server log {server.log_path})", file=sys.stderr)
            return 1
        summary = json.loads(out.read_text())
    _report(summary)
    if options.json:
        Path(options.json).write_text(json.dumps(summary, indent=1))
    return code


if __name__ == "__main__":
    sys.exit(main())
