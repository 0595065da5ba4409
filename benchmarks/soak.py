#!/usr/bin/env python3
"""Soak under churn: is per-client, per-subject, per-connection state released?

Starts one server (or, ``--cluster``, a 3-seed Guaranteed cluster of real processes)
through ``benchmarks/soak_probe.py``, then repeats ``--cycles`` cycles of churn
(``benchmarks/soak_clients.py``: native WebSocket clients that subscribe to subjects
new in each cycle, publish, unsubscribe and leave -- politely, by RST or by a plain
close --, Server-Sent Events streams dropped, HTTP publishes and snapshots, clean and
persistent MQTT sessions, broken clients). After each cycle it samples each server's
RSS (/proc/PID/status), open descriptors (/proc/PID/fd) and its /stats (connections,
subscriptions, subjects, cached messages, Python's allocated blocks), and prints a row.
Three clients per server stay all along (a native one, a persistent MQTT session with a
wildcard filter over every cycle's subjects, an event stream). Then it waits ``--quiet``
seconds with no other client (longer than CacheExpireTime, ``--expire``, and
MqttSessionExpiry, ``--session-expiry``; the MQTT expiry sweep looks at each subject
once a minute, at least 10 subjects a second), sampling ``--quiet-samples`` times: what
is still above the start row then outlives its clients.

With ``--census`` each server counts its gc-tracked objects by type after the first
cycle and after the quiet time (SIGUSR1, see soak_probe.py) and the types that grew
are printed; ``--tracemalloc N`` also traces allocations (N frames) and prints the
allocation sites that grew.

    .venv/bin/python benchmarks/soak.py --cycles 30 --census
    .venv/bin/python benchmarks/soak.py --cluster --cycles 15 --census

Bounded: ``--seconds`` of churn at most (default 15; 12 with ``--cluster``), then
``--quiet`` (default 36); every client 3 s at most: under 60 s a run in all.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster_common import BenchCluster
from soak_clients import Churn, Stayers
from soak_probe import census_path

from migratory.bench.server_process import ServerProcess

PROBE = str(Path(__file__).resolve().parent / "soak_probe.py")
COLUMNS = ("member", "cycle", "secs", "rss_mib", "fds", "conns", "handshakes", "native_subs",
           "hub_subs", "subjects", "cached", "mqtt_stored", "py_blocks", "metric_lines")


class ProbedServer(ServerProcess):
    """A single server started through soak_probe.py."""

    def command(self) -> list[str]:
        return [sys.executable, PROBE, *super().command()[3:]]


def settings(args: argparse.Namespace, audit_dir: str) -> dict[str, str]:
    return {
        # every audit event, rotated at 1 MB: the rotations must not leave descriptors
        "AuditLogFile": f"{audit_dir}/audit.jsonl",
        "AuditAccess": "true",
        "AuditMessage": "true",
        "AuditCache": "true",
        "AuditLogMaxBytes": "1000000",
        "AuditLogBackups": "2",
        "CacheExpireTime": str(args.expire),
        "MqttSessionExpiry": str(args.session_expiry),
        # every client comes from 127.0.0.1: no per-address limits in the way
        "MaxConnectionsPerAddress": "0",
        "MaxHandshakesPerAddress": "0",
        "MaxPublishesPerSecond": "0",
        "HandshakeTimeout": "2",
        "LogLevel": args.log_level,
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def proc_figures(pid: int) -> tuple[float, int]:
    """RSS in MiB and open descriptors of ``pid``."""
    rss_kib = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss_kib = int(line.split()[1])
    return rss_kib / 1024, len(os.listdir(f"/proc/{pid}/fd"))


def sample(member: int, pid: int, port: int, cycle: str, t0: float) -> dict[str, Any]:
    rss, fds = proc_figures(pid)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=5) as reply:
        stats = json.loads(reply.read())
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        metrics = reply.read().decode()
    return {
        # samples in /metrics: a label per client or per subject would make it grow
        "metric_lines": sum(1 for line in metrics.splitlines() if not line.startswith("#")),
        "member": member, "cycle": cycle, "secs": round(time.monotonic() - t0, 1),
        "rss_mib": round(rss, 1), "fds": fds, "conns": stats["connections_open"],
        "handshakes": stats["handshakes_pending"], "native_subs": stats["subscriptions_open"],
        "hub_subs": stats["subscriptions"], "subjects": stats["subjects"],
        "cached": stats["cached_messages"], "mqtt_stored": stats["mqtt_sessions_stored"],
        "py_blocks": stats["python_allocated_blocks"],
    }


def print_row(row: dict[str, Any]) -> None:
    print("  ".join(f"{row[c]!s:>{max(len(c), 6)}}" for c in COLUMNS), flush=True)


def take_census(pid: int, prefix: str) -> dict[str, Any]:
    path = Path(census_path(prefix, pid))
    before = path.stat().st_mtime_ns if path.exists() else None
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_mtime_ns != before:
            return json.loads(path.read_text())  # type: ignore[no-any-return]
        time.sleep(0.05)
    raise TimeoutError(f"no census from {pid}")


def print_growth(member: int, first: dict[str, Any], last: dict[str, Any], cycles: int) -> None:
    grown = sorted(
        ((n - first["objects"].get(t, 0), t, n) for t, n in last["objects"].items()),
        reverse=True,
    )
    print(f"member {member}: Python's allocated blocks after a full collection: "
          f"{first['blocks']} after cycle 1, {last['blocks']} after the quiet time "
          f"({last['blocks'] - first['blocks']:+d})")
    print(f"member {member}: gc-tracked objects grown between the census after cycle 1 and "
          f"the one after the quiet time ({cycles - 1} cycles later), top 15:")
    for delta, name, now in grown[:15]:
        if delta > 0:
            per_cycle = delta / max(1, cycles - 1)
            print(f"  {name:<36} +{delta:<7} ({per_cycle:.1f} per cycle, {now} now)")
    print(f"  subjects by first levels: {last.get('subjects')}")
    for name, holders in last.get("referrers", {}).items():
        print(f"  {name} referred to by: {holders}")
    if "tracemalloc_total" in last:
        size, count = last["tracemalloc_total"]
        print(f"  traced in all: {size:+d} B in {count:+d} blocks; the sites that grew most:")
    for site, size, count in last.get("tracemalloc", [])[:12]:
        print(f"  traced {size:+9d} B {count:+6d} blocks  {site}")


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    scratch = tempfile.mkdtemp(prefix="migratory-soak-")  # census files, audit logs
    prefix = str(Path(scratch) / "census")
    os.environ["MIGRATORY_SOAK_CENSUS"] = prefix
    if args.tracemalloc:
        os.environ["PYTHONTRACEMALLOC"] = str(args.tracemalloc)
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, scratch, ignore_errors=True)
        members: list[tuple[int, int, int]] = []  # (pid, client port, mqtt port)
        if args.cluster:
            cluster = stack.enter_context(BenchCluster("soak", launcher=[PROBE],
                                                       extra=settings(args, scratch)))
            for i in range(cluster.members):
                cluster.settings[i]["ListenMqtt"] = f"127.0.0.1:{free_port()}"
                cluster.settings[i]["AuditLogFile"] = f"{scratch}/audit-{i}.jsonl"
            cluster.start_all()
            cluster.wait_ready(timeout=60)
            for i in range(cluster.members):
                mqtt_port = int(cluster.settings[i]["ListenMqtt"].rsplit(":", 1)[1])
                members.append((cluster.pid(i), cluster.port(i), mqtt_port))
        else:
            single = {**settings(args, scratch), "ListenMqtt": "127.0.0.1:0"}
            server = stack.enter_context(ProbedServer("soak", [
                f"{k}={v}" for k, v in single.items()
            ]))
            members.append((server.pid, server.port, server.mqtt_port))
        return soak(args, members, prefix)


def soak(args: argparse.Namespace, members: list[tuple[int, int, int]],
         prefix: str) -> list[dict[str, Any]]:
    churns = [Churn("127.0.0.1", port, mqtt_port, names=args.names)
              for _, port, mqtt_port in members]
    rows: list[dict[str, Any]] = []
    first_census: dict[int, dict[str, Any]] = {}
    t0 = time.monotonic()
    print("  ".join(f"{c:>{max(len(c), 6)}}" for c in COLUMNS))

    def sample_all(cycle: str) -> None:
        for m, (pid, port, _) in enumerate(members):
            rows.append(sample(m, pid, port, cycle, t0))
            print_row(rows[-1])

    stayers = [Stayers("127.0.0.1", port, mqtt_port, f"soak-stayer-{m}")
               for m, (_, port, mqtt_port) in enumerate(members)]
    sample_all("start")
    cycles = 0
    for c in range(1, args.cycles + 1):
        if time.monotonic() - t0 > args.seconds:
            print(f"stopped after {cycles} cycles: --seconds {args.seconds} spent")
            break
        churns[c % len(churns)].cycle(c)
        cycles = c
        time.sleep(args.settle)
        for stayer in stayers:
            stayer.drain()
        sample_all(str(c))
        if c == 1 and args.census:
            for m, (pid, _, _) in enumerate(members):
                first_census[m] = take_census(pid, prefix)
    for step in range(1, args.quiet_samples + 1):  # no client but the stayers
        time.sleep(args.quiet / args.quiet_samples)
        for stayer in stayers:
            stayer.drain()
        sample_all(f"quiet{step}" if step < args.quiet_samples else "quiet")
    failed = sum((churn.failed for churn in churns), start=type(churns[0].failed)())
    done = sum((churn.done for churn in churns), start=type(churns[0].done)())
    print(f"clients done: {dict(done)}; failed: {dict(failed) or 'none'}; the stayers "
          f"(a native, an MQTT '#' and an SSE client per member, open all along) read "
          f"{sum(s.received for s in stayers)} bytes")
    for m, stayer in enumerate(stayers):
        for kind, last in stayer.closed.items():
            print(f"member {m}: its {kind} stayer was closed by the server; last bytes {last!r}")
    for m, (_, port, _) in enumerate(members):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=5) as reply:
            publishing = json.loads(reply.read())["publishing"]
        print(f"member {m} publishing: {publishing}")
    if args.census:
        for m, (pid, _, _) in enumerate(members):
            print_growth(m, first_census[m], take_census(pid, prefix), cycles)
    for stayer in stayers:
        stayer.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=25)
    parser.add_argument("--seconds", type=float, default=None,
                        help="churn time at most (default 15 s; 12 s with --cluster, which "
                        "takes ~5 s to start: the whole run stays under 60 s)")
    parser.add_argument("--settle", type=float, default=0.2,
                        help="seconds after each cycle before sampling")
    parser.add_argument("--expire", type=int, default=2, help="CacheExpireTime")
    parser.add_argument("--session-expiry", type=int, default=None,
                        help="MqttSessionExpiry (default 2 s; 600 s with --cluster: a member "
                        "refreshes the records of its clients only when its sweep comes by, "
                        "once a minute, so a shorter expiry discards sessions connected to "
                        "other members)")
    parser.add_argument("--quiet", type=float, default=36.0,
                        help="seconds without clients (but the stayers) after the churn: the "
                        "MQTT expiry sweep looks at each subject once a minute at most")
    parser.add_argument("--quiet-samples", type=int, default=4,
                        help="samples taken during the quiet time")
    parser.add_argument("--names", type=int, default=0, metavar="N",
                        help="name subjects and client ids by the cycle modulo N (0: new "
                        "names every cycle): what the names cost is then bounded, so what "
                        "still grows is not a cache of names")
    parser.add_argument("--cluster", action="store_true",
                        help="a 3-seed Guaranteed cluster; cycles go round its members")
    parser.add_argument("--census", action="store_true",
                        help="objects by type after cycle 1 and after the quiet time")
    parser.add_argument("--tracemalloc", type=int, default=0, metavar="FRAMES")
    parser.add_argument("--log-level", default="WARNING", help="the servers' LogLevel")
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()
    if args.session_expiry is None:
        args.session_expiry = 600 if args.cluster else 2
    if args.seconds is None:
        args.seconds = 12.0 if args.cluster else 15.0
    started = time.monotonic()
    rows = run(args)
    print(f"the whole run took {time.monotonic() - started:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
