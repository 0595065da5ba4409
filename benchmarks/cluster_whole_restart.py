"""A whole Guaranteed cluster restarted at once: how long until it serves again.

3 seeds (``--non-seeds 2`` adds two non-seeds), real ``python -m cluster serve``
processes. A paced publisher (``--rate``/s, guaranteed, closures) runs through member 0
for ``--warm`` seconds so the caches and the Raft logs have content, and a subscriber
on member 0 keeps its last position. Then every member is stopped at once
(``--signal TERM`` or ``KILL``) and all are started again: at once (``--order
together``), in reverse order (``reverse``), or all but seed 0 at once and seed 0
``--late`` seconds later (``late``), or all at once with seed 2 stopped (SIGSTOP) as soon
as its cluster port listens and continued ``--late`` seconds later (``stalled``: a
member up but not answering, as one starved on a box far busier than its cores).

Per run, from the start of the new processes (t = 0):

- ``leader``: each member's first /cluster answer naming a Raft leader;
- ``first_ack``: the first PUBLISH_OK (a publisher on every member, one publish
  every 50 ms each, reconnecting while the member is down);
- ``ready``: each member's first 200 on /readyz, and ``all_ready``;
- ``data_sync``: a subscriber that resubscribes (on member 1) with its last position
  from before the stop gets DATA_SYNC;
- ``phases``: per member, the first log line of each phase (``first_line``: the
  process has imported and configured itself, "cluster link on", "Raft state in" (the
  journal loaded), the last "seeds not reached", "Raft node ... started", caches
  restored), in seconds from t = 0.

Usage: ``python benchmarks/cluster_whole_restart.py --runs 3 --signal TERM --order
together``; prints one JSON line per run and a summary. Every loop is bounded; every
member is stopped by PID at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

import cbor2

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster_common import BenchCluster
from cluster_failover import Publisher

from migratory.bench.procfs import handle_sigterm, machine_description
from migratory.bench.wsraw import decode_frames, masked, open_raw, publish_frame

SUBJECT = "/bench/whole"
PROBE_PERIOD = 0.05
SEEDS = 3


class AckProbe(threading.Thread):
    """One publish every PROBE_PERIOD through one member (reconnecting while it is down);
    the monotonic time of the first PUBLISH_OK. One thread per member: a member that
    takes a connection and does not answer holds up only its own probe."""

    def __init__(self, port: int, hard: float) -> None:
        super().__init__(daemon=True)
        self.port, self.hard = port, hard
        self.first_ok: float | None = None
        self.failed: dict[str, int] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        n = 0
        while time.monotonic() < self.hard and self.first_ok is None and not self.stop.is_set():
            try:
                sock, rest = open_raw(self.port, "wr-probe", timeout=1.0)
            except (OSError, ConnectionError, TimeoutError):
                time.sleep(PROBE_PERIOD)
                continue
            buf = bytearray(rest)
            sock.settimeout(PROBE_PERIOD)
            try:
                while time.monotonic() < self.hard and self.first_ok is None \
                        and not self.stop.is_set():
                    n += 1
                    sock.sendall(publish_frame(SUBJECT + "/probe", b"p", f"p{n}"))
                    with contextlib.suppress(TimeoutError):
                        data = sock.recv(65536)
                        if not data:
                            break
                        buf += data
                    ops, rest = decode_frames(bytes(buf))
                    buf[:] = rest
                    self._take(ops)
            except OSError:
                time.sleep(PROBE_PERIOD)
            finally:
                sock.close()

    def _take(self, ops: list) -> None:
        for op in ops:
            if isinstance(op, tuple) or op.get("op") != "publish_status":
                continue
            if op.get("status") == "PUBLISH_OK":
                self.first_ok = self.first_ok or time.monotonic()
            else:
                key = f"{op.get('status')}: {op.get('reason')}"[:80]
                self.failed[key] = self.failed.get(key, 0) + 1


class Watch(threading.Thread):
    """When one member first names a Raft leader (/cluster: a seed) and first answers
    /readyz."""

    def __init__(self, cluster: BenchCluster, i: int, t0: float, hard: float) -> None:
        super().__init__(daemon=True)
        self.cluster, self.i, self.t0, self.hard = cluster, i, t0, hard
        self.leader: float | None = None if i < SEEDS else -1.0
        self.ready: float | None = None

    def run(self) -> None:
        while time.monotonic() < self.hard and (self.leader is None or self.ready is None):
            if self.leader is None:
                with contextlib.suppress(OSError, ValueError):
                    if self.cluster.status(self.i).get("raft_leader"):
                        self.leader = round(time.monotonic() - self.t0, 2)
            if self.ready is None and self.cluster.ready(self.i):
                self.ready = round(time.monotonic() - self.t0, 2)
            time.sleep(0.05)


def resume_sync(
    port: int, position: tuple[int, int], t0: float, hard: float
) -> tuple[float | None, str]:
    """Resubscribe with ``position`` until a DATA_SYNC/DATA_RESYNC; (seconds from t0, status)."""
    while time.monotonic() < hard:
        try:
            sock, buf = open_raw(port, "wr-resume", timeout=1.0)
        except (OSError, ConnectionError, TimeoutError):
            time.sleep(0.05)
            continue
        try:
            req = {"subject": SUBJECT, "epoch": position[0], "seq": position[1]}
            sock.sendall(masked(cbor2.dumps({"op": "subscribe", "subjects": [req]})))
            sock.settimeout(0.2)
            while time.monotonic() < hard:
                ops, buf = decode_frames(buf)
                for op in ops:
                    if isinstance(op, tuple):
                        raise ConnectionError("closed")
                    if op.get("op") == "status" and op.get("status") in (
                            "DATA_SYNC", "DATA_RESYNC"):
                        return time.monotonic() - t0, op["status"]
                try:
                    data = sock.recv(65536)
                except TimeoutError:
                    continue
                if not data:
                    raise ConnectionError("closed")
                buf += data
        except (OSError, ConnectionError):
            time.sleep(0.05)
        finally:
            sock.close()
    return None, "none"


LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d[.,]\d+)")
PHASES = (
    ("first_line", "INFO migratory.server: epoch"),
    ("link_listening", "cluster link on"),
    ("raft_loaded", "Raft state in"),
    ("last_seeds_not_reached", "seeds not reached"),
    ("raft_started", "Raft node"),
    ("caches_restored", "caches restored from the Raft dump"),
)


def phases(path: Path, offset: int, t0_wall: float) -> dict[str, float]:
    """The first (for ``last_*``: the last) log line of each phase after byte ``offset``,
    in seconds from ``t0_wall``."""
    from datetime import datetime

    found: dict[str, float] = {}
    with path.open("rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    for line in text.splitlines():
        m = LOG_TIME.match(line)
        if not m:
            continue
        stamp = datetime.fromisoformat(m.group(1).replace(",", ".")).timestamp()
        for name, needle in PHASES:
            if needle in line and (name.startswith("last_") or name not in found):
                found[name] = round(stamp - t0_wall, 2)
    return found


def stall(cluster: BenchCluster, i: int, until: float) -> threading.Thread:
    """SIGSTOP member ``i`` once its cluster port accepts, SIGCONT it at ``until``."""
    host, port = cluster.settings[i]["ClusterMemberListen"].rsplit(":", 1)

    def run() -> None:
        while time.monotonic() < until:
            with contextlib.suppress(OSError), socket.create_connection((host, int(port)), 0.2):
                os.kill(cluster.pid(i), signal.SIGSTOP)
                break
            time.sleep(0.01)
        time.sleep(max(0.0, until - time.monotonic()))
        os.kill(cluster.pid(i), signal.SIGCONT)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def one_run(cluster: BenchCluster, args: argparse.Namespace) -> dict:
    members = cluster.members
    ports = [cluster.port(i) for i in range(members)]
    pub = Publisher(ports[0], SUBJECT, args.rate, 2000, args.warm + 30)
    pub.start()
    time.sleep(args.warm)
    pub.stop_sending.set()
    pub.join(15)
    # a subscriber that got every acknowledged message resumes from the last one
    position = pub.ok_positions[-1] if pub.ok_positions else None
    offsets = [(cluster.log_dir / f"migratory-{i}.log").stat().st_size for i in range(members)]
    # every member at once
    sig = args.signal
    for p in cluster.procs:
        if p is not None:
            p.send_signal(sig)
    t_stop = time.monotonic()
    for p in cluster.procs:
        if p is not None:
            p.wait(30)
    stopped = time.monotonic() - t_stop
    t0 = time.monotonic()
    t0_wall = time.time()
    order = list(range(members))
    late: list[int] = []
    if args.order == "reverse":
        order.reverse()
    elif args.order == "late":
        order, late = order[1:], [0]
    for i in order:
        cluster.start(i)
    hard = t0 + args.limit
    probes = [AckProbe(port, hard) for port in ports]
    watches = [Watch(cluster, i, t0, hard) for i in range(members)]
    for thread in (*probes, *watches):
        thread.start()
    sync: dict = {}
    resumer = threading.Thread(
        target=lambda: sync.update(zip(("at", "status"), resume_sync(ports[1], position, t0, hard),
                                       strict=True)), daemon=True) if position else None
    if resumer is not None:
        resumer.start()
    stalled = stall(cluster, 2, t0 + args.late) if args.order == "stalled" else None
    if late:
        time.sleep(max(0.0, t0 + args.late - time.monotonic()))
        for i in late:
            cluster.start(i)
    for thread in watches:
        thread.join(max(0.0, hard - time.monotonic()))
    while time.monotonic() < hard and all(p.first_ok is None for p in probes):
        time.sleep(0.05)
    for probe in probes:
        probe.stop.set()
        probe.join(5)
    if resumer is not None:
        resumer.join(max(0.0, hard - time.monotonic()) + 5)
    if stalled is not None:
        stalled.join(args.late + 10)
    oks = [(p.first_ok, i) for i, p in enumerate(probes) if p.first_ok is not None]
    leader = {i: w.leader for i, w in enumerate(watches) if w.leader is not None and i < SEEDS}
    ready = {i: w.ready for i, w in enumerate(watches) if w.ready is not None}
    failed: dict[str, int] = {}
    for probe in probes:
        for key, count in probe.failed.items():
            failed[key] = failed.get(key, 0) + count
    return {
        "signal": sig.name if hasattr(sig, "name") else str(sig),
        "order": args.order,
        "load": os.getloadavg()[0],
        "published": pub.sent, "acked_before": len(pub.ok_times),
        "stopped_s": round(stopped, 2),
        "leader": leader,
        "first_ack": round(min(oks)[0] - t0, 2) if oks else None,
        "first_ack_member": min(oks)[1] if oks else None,
        "ready": ready,
        "all_ready": max(ready.values()) if len(ready) == members else None,
        "data_sync": sync.get("at") and round(sync["at"], 2), "sync_status": sync.get("status"),
        "failed": failed,
        "phases": {i: phases(cluster.log_dir / f"migratory-{i}.log", offsets[i], t0_wall)
                   for i in range(members)},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--non-seeds", type=int, default=0)
    parser.add_argument("--signal", choices=("TERM", "KILL"), default="TERM")
    parser.add_argument("--order", choices=("together", "reverse", "late", "stalled"),
                        default="together")
    parser.add_argument("--late", type=float, default=2.0,
                        help="seconds seed 0 starts late (late), seed 2 is stopped (stalled)")
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--warm", type=float, default=8.0)
    parser.add_argument("--limit", type=float, default=120.0, help="seconds a run may take")
    args = parser.parse_args()
    args.signal = getattr(signal, f"SIG{args.signal}")
    handle_sigterm()
    results = []
    with BenchCluster("whole-restart", members=SEEDS + args.non_seeds, seeds=SEEDS) as cluster:
        cluster.start_all()
        cluster.wait_ready(timeout=90)
        for _ in range(args.runs):
            result = one_run(cluster, args)
            print(json.dumps(result), flush=True)
            results.append(result)
            cluster.wait_ready(timeout=60)
        summary = {"machine": machine_description(), "uptime": os.getloadavg(),
                   "logs": str(cluster.log_dir), "log_summary": cluster.log_summary()}
        for key in ("first_ack", "all_ready", "data_sync"):
            values = [r[key] for r in results if r[key] is not None]
            if values:
                summary[key] = {"median": statistics.median(values), "max": max(values),
                                "missing": len(results) - len(values)}
        print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
