"""Elections while every seed lives: how often a busy 3-seed cluster changes its Raft leader.

A real 3-seed Guaranteed cluster on 127.0.0.1 (``ClusterElectionTimeout`` from --set);
a paced publisher with closures through a follower seed for --seconds; one load:
  fanout  --subscribers raw WebSocket subscribers of the published subject on the leader
          (its trio loop encodes and writes every delivery);
  hog     --hogs processes spinning on the CPU beside the members (each bounded by
          --seconds itself, and stopped by PID at the end);
  both    the two together;
  disk    --writers processes writing 16 MiB and fsyncing it, over and over, in the
          seeds' file system (beside their ClusterDataDir; bounded by --seconds, stopped
          by PID, the files removed);
  throttle  each seed frozen (SIGSTOP) for --frozen-ms of every 100 ms, then let run
          (SIGCONT), the seeds out of phase: what a pod over its CPU limit gets from the
          CFS quota (the kernel stops its threads until the next 100 ms period);
          --frozen-seeds followers: only the two seeds that follow at the start
          (one-follower: one of them);
  none    nothing else.
Every 50 ms each seed's /cluster is read: the terms seen, the leader changes and when;
at the end each seed's /stats loop gaps (largest event-loop gap per second) are set
beside the seconds in which the term changed. Reported: elections (term increments of the
highest term) per minute, leader changes, publishes failed per reason, the leader's
longest loop gap and the gaps of the seconds with an election.
Exit 0 = ran (a figure, no target), 2 = could not run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import cbor2

sys.path.insert(0, str(Path(__file__).resolve().parent))

import itertools

from cluster_common import BenchCluster
from cluster_failover import Publisher

from migratory.bench.procfs import handle_sigterm, machine_description, raise_nofile
from migratory.bench.wsraw import RECV_SIZE, close_all, masked, open_connections

SUBJECT = "/bench/elections"


class Drain(threading.Thread):
    """Reads and discards what the subscribers receive, until told to stop (or ``seconds``)."""

    def __init__(self, socks: list[Any], seconds: float) -> None:
        super().__init__(daemon=True)
        self.socks, self.seconds = socks, seconds
        self.stop = threading.Event()
        self.received = 0

    def run(self) -> None:
        ep = select.epoll()
        by_fd = {s.fileno(): s for s in self.socks}
        for fd in by_fd:
            ep.register(fd, select.EPOLLIN)
        hard = time.monotonic() + self.seconds
        try:
            while not self.stop.is_set() and time.monotonic() < hard:
                for fd, _ev in ep.poll(0.1):
                    try:
                        data = by_fd[fd].recv(RECV_SIZE)
                    except BlockingIOError:
                        continue
                    except OSError:
                        data = b""
                    if not data:
                        ep.unregister(fd)
                    self.received += len(data)
        finally:
            ep.close()


class Watch(threading.Thread):
    """Reads every seed's /cluster every 50 ms: (monotonic s, seed, term, state)."""

    def __init__(self, cluster: BenchCluster, seconds: float) -> None:
        super().__init__(daemon=True)
        self.cluster, self.seconds = cluster, seconds
        self.stop = threading.Event()
        self.samples: list[tuple[float, int, int, str]] = []

    def run(self) -> None:
        hard = time.monotonic() + self.seconds
        while not self.stop.is_set() and time.monotonic() < hard:
            for i in range(3):
                with contextlib.suppress(OSError, ValueError):
                    st = self.cluster.status(i)
                    self.samples.append((time.monotonic(), i, int(st.get("raft_term") or 0),
                                         str(st.get("raft_state"))))
            time.sleep(0.05)


def term_changes(samples: list[tuple[float, int, int, str]]) -> list[tuple[float, int]]:
    """When the highest term seen went up: (monotonic s, new term)."""
    changes, top = [], None
    for t, _i, term, _state in samples:
        if top is None:
            top = term
        elif term > top:
            changes.append((t, term))
            top = term
    return changes


def leader_changes(samples: list[tuple[float, int, int, str]]) -> int:
    leaders = [i for _t, i, _term, state in samples if state == "leader"]
    return sum(1 for a, b in itertools.pairwise(leaders) if a != b)


def open_subscribers(port: int, count: int) -> list[Any]:
    def frames_for(index: int) -> bytes:
        connect = {"op": "connect", "version": 1, "client": f"el-{index}"}
        subscribe = {"op": "subscribe", "subjects": [{"subject": SUBJECT}]}
        return masked(cbor2.dumps(connect)) + masked(cbor2.dumps(subscribe))

    setup = open_connections("127.0.0.1", port, range(count), frames_for,
                             ready_marker=b"SUBSCRIBE_ALLOW", timeout=60)
    if len(setup.ready) != count:
        close_all(setup.ready)
        raise RuntimeError(f"{len(setup.ready)} of {count} subscribed: {dict(setup.failures)}")
    return [conn.sock for conn in setup.ready]


HOG = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end: pass\n"


WRITER = (
    "import os, time\n"
    "path = {path!r}\n"
    "end = time.monotonic() + {s}\n"
    "chunk = b'w' * (1 << 20)\n"
    "fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)\n"
    "try:\n"
    "    while time.monotonic() < end:\n"
    "        os.lseek(fd, 0, 0)\n"
    "        for _ in range(16):\n"
    "            os.write(fd, chunk)\n"
    "        os.fsync(fd)\n"
    "finally:\n"
    "    os.close(fd)\n"
    "    os.unlink(path)\n"
)


class Throttle(threading.Thread):
    """SIGSTOP each pid for ``frozen`` s of every ``period`` s (phases spread); SIGCONT
    at the end."""

    def __init__(self, pids: list[int], frozen: float, seconds: float,
                 period: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.pids, self.frozen, self.seconds, self.period = pids, frozen, seconds, period
        self.stop = threading.Event()

    def run(self) -> None:
        # each pid stopped at its own phase, let run again ``frozen`` later (mod the period)
        phases = [k * self.period / len(self.pids) for k in range(len(self.pids))]
        events = sorted(
            [(phase, signal.SIGSTOP, pid) for phase, pid in zip(phases, self.pids, strict=True)]
            + [((phase + self.frozen) % self.period, signal.SIGCONT, pid)
               for phase, pid in zip(phases, self.pids, strict=True)])
        t0 = time.monotonic()
        hard = t0 + self.seconds
        try:
            base = t0
            while not self.stop.is_set() and time.monotonic() < hard:
                for offset, sig, pid in events:
                    delay = base + offset - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, sig)
                base += self.period
        finally:
            for pid in self.pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)


def gaps_by_second(stats: dict[str, Any]) -> dict[int, float]:
    return {int(s): g for s, g in (stats.get("loop_gaps") or {}).get("per_second") or []}


def run(args: argparse.Namespace) -> dict[str, Any]:
    extra = dict(setting.split("=", 1) for setting in args.set)
    cluster = BenchCluster("cluster-spurious-elections", extra=extra or None)
    hogs: list[subprocess.Popen[bytes]] = []
    socks: list[Any] = []
    throttle: Throttle | None = None
    try:
        cluster.start_all()
        cluster.wait_ready()
        leader = cluster.leader()
        time.sleep(1.0)
        leader = cluster.leader()
        via = (leader + 1) % 3
        if args.load in ("fanout", "both"):
            socks = open_subscribers(cluster.port(leader), args.subscribers)
        drain = Drain(socks, args.seconds + 30)
        drain.start()
        watch = Watch(cluster, args.seconds + 30)
        watch.start()
        time.sleep(1.0)
        start_terms = [cluster.status(i).get("raft_term") for i in range(3)]
        t0 = time.monotonic()
        if args.load in ("hog", "both"):
            hogs = [subprocess.Popen([sys.executable, "-c", HOG.format(s=args.seconds)])
                    for _ in range(args.hogs)]
        if args.load == "disk":
            hogs = [subprocess.Popen([sys.executable, "-c", WRITER.format(
                path=str(cluster.log_dir / f"writer-{n}"), s=args.seconds)])
                for n in range(args.writers)]
        if args.load == "throttle":
            frozen = [i for i in range(3) if args.frozen_seeds == "all" or i != leader]
            frozen = frozen[:1] if args.frozen_seeds == "one-follower" else frozen
            throttle = Throttle([cluster.pid(i) for i in frozen], args.frozen_ms / 1000,
                                args.seconds)
            throttle.start()
        pub = Publisher(cluster.port(via), SUBJECT, args.pub_rate, args.outstanding,
                        args.seconds + 30)
        pub.start()
        time.sleep(args.seconds)
        pub.stop_sending.set()
        t1 = time.monotonic()
        if throttle is not None:
            throttle.stop.set()
            throttle.join(5)
        for hog in hogs:
            hog.kill()
            hog.wait(5)
        pub.join(30)
        watch.stop.set()
        watch.join(5)
        drain.stop.set()
        drain.join(5)
        stats = [cluster.stats(i) for i in range(3)]
        end_terms = [cluster.status(i).get("raft_term") for i in range(3)]
    finally:
        if throttle is not None:
            throttle.stop.set()
            throttle.join(5)
        for hog in hogs:
            if hog.poll() is None:
                hog.kill()
                hog.wait(5)
        for sock in socks:
            sock.close()
        cluster.stop()
    inside = [s for s in watch.samples if t0 - 0.5 <= s[0] <= t1 + 0.5]
    changes = [(t, term) for t, term in term_changes(inside) if t0 <= t <= t1 + 0.5]
    gaps = [gaps_by_second(s) for s in stats]
    window = range(int(t0), int(t1) + 1)
    return {
        "settings": vars(args),
        "machine": machine_description(),
        "log_dir": str(cluster.log_dir),
        "leader_at_start": leader,
        "published_via": via,
        "terms_start": start_terms,
        "terms_end": end_terms,
        "elections": len(changes),
        "elections_per_minute": round(len(changes) * 60 / (t1 - t0), 1),
        "leader_changes": leader_changes(inside),
        "sent": pub.sent,
        "ok": len(pub.ok_times),
        "failed": dict(pub.failed),
        "unanswered": len(pub.sent_times),
        "skipped_outstanding_full": pub.skipped,
        "publisher_errors": [e for e in (pub.error, pub.closed) if e],
        "subscriber_bytes": drain.received,
        # largest loop gap (ms) in the window, per seed; the first is the starting leader
        "loop_gap_max_ms": [max((g.get(s, 0.0) for s in window), default=0.0) for g in gaps],
        "loop_gap_seconds_over_150ms": [sum(1 for s in window if g.get(s, 0.0) > 150)
                                        for g in gaps],
        # each election: its time from the start (s), the new term, each seed's
        # largest loop gap (ms) in that second and the one before
        "election_gaps": [
            {"at_s": round(t - t0, 2), "term": term,
             "gaps_ms": [max(g.get(int(t), 0.0), g.get(int(t) - 1, 0.0)) for g in gaps]}
            for t, term in changes
        ],
        "log_counts": cluster.log_summary(),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--load", default="fanout",
                   choices=("fanout", "hog", "both", "disk", "throttle", "none"))
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--subscribers", type=int, default=1000)
    p.add_argument("--hogs", type=int, default=4)
    p.add_argument("--writers", type=int, default=2)
    p.add_argument("--frozen-ms", type=float, default=80)
    p.add_argument("--frozen-seeds", choices=("all", "followers", "one-follower"),
                   default="all",
                   help="throttle: every seed, the two that follow at the start, or one")
    p.add_argument("--pub-rate", type=float, default=500)
    p.add_argument("--outstanding", type=int, default=5000)
    p.add_argument("--json")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a config key for every member, e.g. ClusterElectionTimeout=600")
    args = p.parse_args()
    if args.seconds > 300:
        p.error("--seconds is at most 300")
    raise_nofile()
    handle_sigterm()
    try:
        r = run(args)
    except (RuntimeError, TimeoutError, OSError, KeyboardInterrupt, SystemExit) as exc:
        print(f"could not run: {exc!r}", file=sys.stderr)
        return 2
    print(json.dumps({k: r[k] for k in (
        "elections", "elections_per_minute", "leader_changes", "terms_start", "terms_end",
        "sent", "ok", "failed", "unanswered", "loop_gap_max_ms",
        "loop_gap_seconds_over_150ms", "election_gaps", "publisher_errors")}, default=str))
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=2, sort_keys=True, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
