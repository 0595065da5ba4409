"""Raft under load with leader kills: any CRITICAL, and do the seeds' state machines agree?

Three seed processes take Raft commits (``appendEntriesUseBatch=False`` as the seeds run
it) while the Raft leader is SIGKILLed and restarted from its data directory every
``--kill-every`` seconds. At the end, with the load stopped, it waits (bounded) until the
three seeds have applied the same commit index, then compares their
``coordinator_digest`` (a digest of every subject group's epoch and every subject's
seq), and counts in their logs: CRITICAL lines, pysyncobj's "truncating already-applied
log entries", our follower's "state machine diverged", and tracebacks.

``--layer raft`` (default): three ``raft_load_node.py`` processes, each the seeds'
``RaftCoordination`` alone, submitting one-publish commands with ``--window`` in flight:
a few thousand Raft commits/s. ``--layer member``: three real members
(``python -m cluster serve``) with raw publishers on every member; their submit loop
groups publishes, so Raft sees far fewer (larger) commits.

``--follower pysyncobj`` runs pysyncobj 0.3.17's own AppendEntries handling
(``FollowerSafeSyncObj``'s override removed) for comparison.

    .venv/bin/python benchmarks/cluster_raft_divergence.py [--layer raft] [--duration 60]

Exit 0 = PASS (no CRITICAL, no traceback, equal digests), 1 = FAIL, 2 = could not run.
Results in ``benchmarks/results/cluster-raft-divergence-*.json``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster_common import BenchCluster

from cluster.tooling import free_base_port
from migratory.bench.procfs import die_with_parent, machine_description
from migratory.bench.server_process import RESULTS_DIR
from migratory.bench.wsraw import open_raw, publish_frame

OK, FAILED = b"PUBLISH_OK", b"PUBLISH_FAILED"
PATTERNS = {
    "critical": " CRITICAL ",
    "truncating_applied": "truncating already-applied log entries",
    "diverged": "state machine diverged",
    "traceback": "Traceback",
}


def publisher(ports: list[int], k: int, conns: int, window: int, seconds: float, out) -> None:
    """``conns`` raw connections keeping ``window`` publishes in flight each; a connection
    that breaks (its member was killed) is re-made to another member."""
    die_with_parent()
    rng = random.Random(k)
    frames = [publish_frame(f"/div/s{(k * 31 + i) % 200}", b"%08d" % i, str(i))
              for i in range(500)]
    ep = select.epoll()
    socks: dict[int, socket.socket] = {}
    state: dict[int, dict] = {}
    ok = failed = sent = reconnects = 0
    end = time.monotonic() + seconds

    def connect() -> None:
        nonlocal reconnects
        for _ in range(50):
            port = rng.choice(ports)
            try:
                sock, _ = open_raw(port, f"div-{k}-{rng.randrange(10**6)}", timeout=2)
            except (OSError, TimeoutError, ConnectionError):
                time.sleep(0.1)
                continue
            sock.setblocking(False)
            socks[sock.fileno()] = sock
            state[sock.fileno()] = {"inflight": 0, "out": bytearray(), "p": 0, "tails": b""}
            ep.register(sock.fileno(), select.EPOLLIN)
            reconnects += 1
            return

    def drop(fd: int) -> None:
        ep.unregister(fd)
        socks.pop(fd).close()
        state.pop(fd)

    for _ in range(conns):
        connect()
    while time.monotonic() < end:
        for fd, st in list(state.items()):
            while st["inflight"] < window:
                st["out"] += frames[st["p"]]
                st["p"] = (st["p"] + 1) % len(frames)
                st["inflight"] += 1
                sent += 1
            try:
                del st["out"][: socks[fd].send(st["out"])]
            except BlockingIOError:
                pass
            except OSError:
                drop(fd)
        for fd, _ev in ep.poll(0.02):
            if fd not in socks:
                continue
            try:
                data = socks[fd].recv(262144)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                drop(fd)
                continue
            st = state[fd]
            buf = st["tails"] + data
            n_ok, n_failed = buf.count(OK), buf.count(FAILED)
            st["tails"] = buf[-(len(FAILED) - 1):]
            ok, failed = ok + n_ok, failed + n_failed
            st["inflight"] = max(0, st["inflight"] - n_ok - n_failed)
        while len(socks) < conns and time.monotonic() < end:
            connect()
    for fd in list(socks):
        drop(fd)
    out.put({"ok": ok, "failed": failed, "sent": sent, "connections": reconnects})


def raft_status(cluster: BenchCluster, i: int) -> dict:
    try:
        return cluster.status(i)
    except OSError:
        return {}


def commit_rate(cluster: BenchCluster, seconds: float) -> float:
    """Raft commits/s seen by the leader over ``seconds``."""
    leader = cluster.leader()
    first = raft_status(cluster, leader).get("raft_commit_index") or 0
    time.sleep(seconds)
    last = raft_status(cluster, leader).get("raft_commit_index") or 0
    return (last - first) / seconds


def settle(cluster: BenchCluster, timeout: float) -> list[dict]:
    """Statuses once every seed has applied the same commit index (and its digest is
    recomputed, once a second), or the last ones seen."""
    deadline = time.monotonic() + timeout
    statuses: list[dict] = []
    while time.monotonic() < deadline:
        statuses = [raft_status(cluster, i) for i in range(cluster.members)]
        applied = {s.get("raft_last_applied") for s in statuses}
        if len(applied) == 1 and None not in applied:
            time.sleep(1.2)  # the digest is recomputed every second
            statuses = [raft_status(cluster, i) for i in range(cluster.members)]
            if len({s.get("raft_last_applied") for s in statuses}) == 1:
                return statuses
        time.sleep(0.3)
    return statuses


def count_lines(log_dir: Path) -> dict[str, int]:
    counts = dict.fromkeys(PATTERNS, 0)
    for path in log_dir.glob("*.log"):
        for line in path.read_text(errors="replace").splitlines():
            for name, pattern in PATTERNS.items():
                counts[name] += pattern in line
    return counts


class RaftNodes:
    """Three ``raft_load_node.py`` processes; each writes its status to a file."""

    members = 3

    def __init__(self, follower: str, window: int) -> None:
        self.follower, self.window = follower, window
        self.base = free_base_port(3)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.log_dir = RESULTS_DIR / f"raft-divergence-{follower}-{stamp}-{os.getpid()}"
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * 3
        for i in range(3):
            self.dir(i).mkdir(parents=True)

    def dir(self, i: int) -> Path:
        return self.log_dir / f"node-{i}"

    def start(self, i: int) -> None:
        (self.dir(i) / "status.json").unlink(missing_ok=True)
        with (self.log_dir / f"node-{i}.log").open("ab") as log:
            self.procs[i] = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve().parent / "raft_load_node.py"),
                 "--index", str(i), "--base", str(self.base), "--dir", str(self.dir(i)),
                 "--window", str(self.window), "--follower", self.follower],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                start_new_session=True, preexec_fn=lambda: die_with_parent(signal.SIGKILL),
            )

    def status(self, i: int) -> dict:
        try:
            status: dict = json.loads((self.dir(i) / "status.json").read_text())
        except (OSError, ValueError):
            return {}
        return status if time.time() - status.get("time", 0) < 2 else {}

    def leader(self, timeout: float = 20) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leaders = [(s.get("raft_term", 0), i) for i in range(3)
                       if (s := self.status(i)).get("raft_state") == "leader"]
            if leaders:
                return max(leaders)[1]
            time.sleep(0.05)
        raise RuntimeError("no Raft leader")

    def kill(self, i: int) -> None:
        proc = self.procs[i]
        assert proc is not None
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        (self.dir(i) / "status.json").unlink(missing_ok=True)

    def stop_load(self) -> None:
        for i in range(3):
            (self.dir(i) / "stop").touch()

    def stop(self) -> None:
        for proc in self.procs:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            if proc is not None:
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)


def run_raft(args: argparse.Namespace) -> dict:
    nodes = RaftNodes(args.follower, args.window)
    kills: list[dict] = []
    try:
        for i in range(3):
            nodes.start(i)
        nodes.leader(60)
        print(f"Raft nodes up, logs {nodes.log_dir}", flush=True)
        started = time.monotonic()
        rates = [raft_rate(nodes, 2.0)]
        print(f"Raft commits/s before the first kill: {rates[0]:.0f}", flush=True)
        while time.monotonic() - started + args.kill_every < args.duration:
            time.sleep(max(0.0, args.kill_every - 2.0))
            leader = nodes.leader()
            nodes.kill(leader)
            t_kill = time.monotonic()
            new_leader = nodes.leader()
            kills.append({"killed": leader, "new_leader": new_leader,
                          "new_leader_seen_s": round(time.monotonic() - t_kill, 2)})
            time.sleep(1.0)
            nodes.start(leader)
            print(f"killed leader {leader}; new leader {new_leader}; restarted {leader}",
                  flush=True)
            rates.append(raft_rate(nodes, 1.0))
        nodes.stop_load()
        statuses = settle_files(nodes, 60)
    finally:
        nodes.stop()
    return summarize(args, nodes.log_dir, statuses, rates, kills,
                     acknowledged=sum(s.get("ok", 0) for s in statuses))


def raft_rate(nodes: RaftNodes, seconds: float) -> float:
    leader = nodes.leader()
    first = nodes.status(leader).get("raft_commit_index") or 0
    time.sleep(seconds)
    last = nodes.status(leader).get("raft_commit_index") or 0
    return (last - first) / seconds


def settle_files(nodes: RaftNodes, timeout: float) -> list[dict]:
    deadline = time.monotonic() + timeout
    statuses: list[dict] = []
    while time.monotonic() < deadline:
        statuses = [nodes.status(i) for i in range(3)]
        applied = {s.get("raft_last_applied") for s in statuses}
        digests = {s.get("coordinator_digest") for s in statuses}
        if len(applied) == 1 and None not in applied and len(digests) == 1:
            return statuses
        time.sleep(0.3)
    return statuses


def run(args: argparse.Namespace) -> dict:
    if args.layer == "raft":
        return run_raft(args)
    launcher = None
    if args.follower == "pysyncobj":
        launcher = [str(Path(__file__).resolve().parent / "cluster_raft_pysyncobj_member.py")]
    cluster = BenchCluster(f"cluster-raft-divergence-{args.follower}", launcher=launcher)
    procs: list[mp.Process] = []
    kills: list[dict] = []
    try:
        cluster.start_all()
        print(f"cluster ready in {cluster.wait_ready():.1f} s, logs {cluster.log_dir}",
              flush=True)
        ports = [cluster.port(i) for i in range(cluster.members)]
        results: mp.Queue = mp.Queue()
        for k in range(args.procs):
            proc = mp.Process(target=publisher, daemon=True, args=(
                ports, k, args.conns, args.window, args.duration, results))
            proc.start()
            procs.append(proc)
        started = time.monotonic()
        rates = [commit_rate(cluster, 2.0)]
        print(f"Raft commits/s before the first kill: {rates[0]:.0f}", flush=True)
        while time.monotonic() - started + args.kill_every < args.duration:
            time.sleep(max(0.0, args.kill_every - 2.0))
            leader = cluster.leader()
            cluster.kill(leader)
            t_kill = time.monotonic()
            new_leader = cluster.leader()
            elected = time.monotonic() - t_kill
            time.sleep(1.0)
            cluster.start(leader)
            kills.append({"killed": leader, "new_leader": new_leader,
                          "new_leader_seen_s": round(elected, 2)})
            print(f"killed leader {leader}; new leader {new_leader} seen after "
                  f"{elected:.2f} s; restarted {leader}", flush=True)
            rates.append(commit_rate(cluster, 1.0))
        load = [results.get(timeout=args.duration + 60) for _ in procs]
        for proc in procs:
            proc.join(10)
        statuses = settle(cluster, 60)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
        cluster.stop()
    return summarize(args, cluster.log_dir, statuses, rates, kills,
                     acknowledged=sum(x["ok"] for x in load),
                     publish_failed=sum(x["failed"] for x in load))


def summarize(args: argparse.Namespace, log_dir: Path, statuses: list[dict],
              rates: list[float], kills: list[dict], **load: int) -> dict:
    digests = [s.get("coordinator_digest") for s in statuses]
    lines = count_lines(log_dir)
    summary = {
        "layer": args.layer,
        "follower": args.follower,
        "duration_s": args.duration,
        **load,
        "raft_commits_per_s": [round(r) for r in rates],
        "leader_kills": kills,
        "final": [{k: s.get(k) for k in ("raft_commit_index", "raft_last_applied", "clsn",
                                          "coordinator_digest")} for s in statuses],
        "digests_equal": len(set(digests)) == 1 and None not in digests,
        "log_lines": lines,
        "log_dir": str(log_dir),
        "machine": machine_description(),
        "settings": vars(args),
    }
    summary["pass"] = (summary["digests_equal"] and lines["critical"] == 0
                       and lines["traceback"] == 0 and len(kills) > 0)
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--kill-every", type=float, default=10.0)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--conns", type=int, default=3)
    parser.add_argument("--window", type=int, default=64,
                        help="commands (raft) or publishes per connection (member) in flight")
    parser.add_argument("--layer", choices=("raft", "member"), default="raft")
    parser.add_argument("--follower", choices=("ours", "pysyncobj"), default="ours")
    args = parser.parse_args()
    try:
        summary = run(args)
    except (OSError, RuntimeError, TimeoutError) as exc:
        print(f"could not run: {exc}", file=sys.stderr)
        return 2
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = RESULTS_DIR / f"raft-divergence-{args.layer}-{args.follower}-{stamp}.json"
    out.write_text(json.dumps(summary, indent=2))
    print(json.dumps({k: v for k, v in summary.items() if k not in ("machine", "settings")},
                     indent=2))
    print(f"{'PASS' if summary['pass'] else 'FAIL'} (results in {out})")
    return 0 if summary["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
