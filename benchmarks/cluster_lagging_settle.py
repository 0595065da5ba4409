"""A lagging member's herd of waiting resumes (issue 13, "no stalls"): clients resuming
on a member from positions it has not reached wait (``Hub._subscribe``), and are all
answered when it catches up (``migratory/server/hub_settle.py``) -- the clients of a
member that died, resuming on one behind the cluster.

A Guaranteed cluster of 3 seeds (behind TCP gates: tests/cluster/gated_seeds.py) and
one non-seed, the lagging member. ``--subjects`` subjects get ``--fill`` acknowledged
messages each; ``--procs`` client processes open ``--clients`` raw WebSocket clients to
the non-seed. Then the seeds' replies on cluster links are held (``TcpGate.hold_back``;
Raft goes on), each subject gets ``--ahead`` more acknowledged messages, and every client
resumes
``--per-client`` subjects, each from a position 0-49 (under ``--ahead``) messages short
of the subject's (ahead of the held member: the resume waits). Once every client has its
``SUBSCRIBE_ALLOW`` s, the replies go: the member catches up and settles the herd.
Reported: the member's longest event-loop gap from the release until every client has
its ``DATA_SYNC`` s (``/stats loop_gaps``), what the gaps over 50 ms were made of, the time to
all synced, the member's ``loop_turns``; ``synced_with_allow`` counts clients synced
before the release (the member had not waited). The hold must stay under the member's
upstream silence (2 s: past it the member sends its clients elsewhere), so keep
``--subjects`` x ``--ahead`` and the herd's subscribes small enough for the box::

    .venv/bin/python benchmarks/cluster_lagging_settle.py --clients 4000 --subjects 1 \\
        --per-client 1 --fill 200 --ahead 300

    .venv/bin/python benchmarks/cluster_lagging_settle.py --clients 2000 --subjects 1000 \
        --per-client 10 --fill 3 --ahead 3

docs/benchmarks.md, "A lagging member's waiting resumes".
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import selectors
import socket
import sys
import time
from collections import Counter
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "server"))
sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "cluster"))
sys.path.insert(0, str(Path(__file__).parent))

from cluster_common import BenchCluster
from cluster_join_sync import long_gap_parts
from gated_seeds import behind_gates
from rawclient import RawClient

from migratory.bench.procfs import machine_description
from migratory.model.message import Message
from migratory.model.position import Position
from migratory.protocol import ops
from migratory.protocol import websocket as ws

LAGGING = 3  # the non-seed
MARKERS = (b"SUBSCRIBE_ALLOW", b"DATA_SYNC")


def say(what: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {what}", file=sys.stderr, flush=True)
SEEDS = range(3)


def publish_all(port: int, subjects: list[str], count: int) -> dict[str, Position]:
    """``count`` acknowledged messages on each subject, up to 5,000 in flight; each
    subject's last position."""
    publisher = RawClient(port, timeout=60)
    publisher.connect("publisher")
    last: dict[str, Position] = {}
    closures = [(subject, n) for n in range(count) for subject in subjects]
    for start in range(0, len(closures), 5000):
        chunk = closures[start:start + 5000]
        publisher.sock.sendall(b"".join(
            ws.encode_masked_binary(ops.encode_client_op(ops.Publish(Message(
                subject, b"x" * 100, closure=f"{subject} {n}"))), b"abcd")
            for subject, n in chunk))
        waiting = len(chunk)
        while waiting:
            op = publisher.recv_op()
            if isinstance(op, ops.PublishStatus) and op.closure is not None:
                assert op.status is ops.Status.PUBLISH_OK and op.position is not None, op
                subject = op.closure.rsplit(" ", 1)[0]
                if subject not in last or last[subject].seq < op.position.seq:
                    last[subject] = op.position
                waiting -= 1
    publisher.close()
    return last


def count_until(socks: list[socket.socket], marker: bytes, wanted: int, seconds: float,
                seen: dict[int, list[Any]]) -> tuple[int, float]:
    """Read every socket until each has seen ``wanted`` ``marker`` s (``seen``: by
    descriptor, the tail read and the count of each marker so far, kept across calls):
    the clients that did, and when the last did (``time.monotonic``)."""
    selector = selectors.DefaultSelector()
    done, last = 0, 0.0
    for sock in socks:
        if seen[sock.fileno()][1][marker] >= wanted:
            done += 1
        else:
            selector.register(sock, selectors.EVENT_READ)
    deadline = time.monotonic() + seconds
    while done < len(socks) and time.monotonic() < deadline:
        for key, _ in selector.select(0.2):
            sock = key.fileobj
            try:
                data = sock.recv(1 << 20)  # type: ignore[union-attr]
            except BlockingIOError:
                continue
            if not data:
                selector.unregister(sock)
                continue
            entry = seen[sock.fileno()]  # type: ignore[union-attr]
            both = entry[0] + data
            for each in MARKERS:
                entry[1][each] += both.count(each) - entry[0].count(each)
            entry[0] = both[-16:]
            if entry[1][marker] >= wanted:
                selector.unregister(sock)
                done += 1
                last = time.monotonic()
    selector.close()
    return done, last


def swarm(port: int, count: int, per_client: int, pipe: Connection) -> None:
    """One client process: connect, say so; take the resumes' frames, send them, say when
    every client has its SUBSCRIBE_ALLOW s, then when every one has its DATA_SYNC s."""
    socks = []
    for i in range(count):
        client = RawClient(port, timeout=120)
        client.connect(f"lag{os.getpid()}-{i}")
        client.sock.setblocking(False)
        socks.append(client.sock)
    pipe.send("connected")
    frames = pipe.recv()
    for sock, frame in zip(socks, frames, strict=True):
        sock.setblocking(True)
        sock.sendall(frame)
        sock.setblocking(False)
    seen = {sock.fileno(): [b"", Counter[bytes]()] for sock in socks}
    allowed, _ = count_until(socks, b"SUBSCRIBE_ALLOW", per_client, 60, seen)
    # a DATA_SYNC before the release: the member had caught up already (no wait)
    early = sum(1 for entry in seen.values() if entry[1][b"DATA_SYNC"])
    pipe.send({"allowed": allowed, "synced_early": early})
    pipe.recv()  # released
    synced, last = count_until(socks, b"DATA_SYNC", per_client, 300, seen)
    pipe.send({"synced": synced, "last": last})
    for sock in socks:
        sock.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=4000)
    parser.add_argument("--subjects", type=int, default=1)
    parser.add_argument("--per-client", type=int, default=1)
    parser.add_argument("--fill", type=int, default=200, help="messages per subject first")
    parser.add_argument("--ahead", type=int, default=300,
                        help="messages per subject the held member lacks")
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    subjects = [f"/Lag/s{i}" for i in range(args.subjects)]
    cluster = BenchCluster("lagging-settle", members=4, seeds=3,
                           extra={"MaxCachedMessagesPerSubject": "1000"})
    gates = behind_gates(cluster)  # type: ignore[arg-type]  # (its settings and base)
    context = multiprocessing.get_context("fork")
    procs = []
    try:
        cluster.start_all()
        cluster.wait_ready(timeout=60)
        say("cluster ready")
        publish_port = cluster.port(cluster.leader())
        publish_all(publish_port, subjects, args.fill)
        say("filled")
        pipes = []
        for p in range(args.procs):
            ours, theirs = context.Pipe()
            share = len(range(p, args.clients, args.procs))
            proc = context.Process(target=swarm, args=(cluster.port(LAGGING), share,
                                                       args.per_client, theirs))
            proc.start()
            procs.append(proc)
            pipes.append(ours)
        for pipe in pipes:
            assert pipe.recv() == "connected"
        say("clients connected")
        time.sleep(1.0)
        for i in SEEDS:  # (from any seed: it would leave a silent one for another)
            gates[i][0].hold_back()
        held = time.monotonic()
        last = publish_all(publish_port, subjects, args.ahead)
        rng = random.Random(args.seed)
        frames = []
        for _ in range(args.clients):
            requests = tuple(
                ops.SubscriptionRequest(s, position=Position(
                    last[s].epoch, last[s].seq - rng.randrange(min(50, args.ahead))))
                for s in rng.sample(subjects, args.per_client))
            frames.append(ws.encode_masked_binary(
                ops.encode_client_op(ops.Subscribe(requests)), b"abcd"))
        for p, pipe in enumerate(pipes):
            pipe.send(frames[p::args.procs])
        allowed = [pipe.recv() for pipe in pipes]
        say(f"allowed: {allowed}")
        waited_s = time.monotonic() - held
        before = cluster.stats(LAGGING)
        released = time.monotonic()
        for i in SEEDS:
            gates[i][0].release(settle=0.0)
        for pipe in pipes:
            pipe.send("go")
        results = [pipe.recv() for pipe in pipes]
        ended = max(r["last"] for r in results)
        time.sleep(1.1)  # the last second's gaps reach /stats
        stats = cluster.stats(LAGGING)
        gaps = stats["loop_gaps"]
        inside = [gap for second, gap in gaps["per_second"]
                  if int(released) <= second <= int(ended) + 1]
        print(json.dumps({
            "clients": args.clients, "subjects": args.subjects,
            "per_client": args.per_client, "fill": args.fill, "ahead": args.ahead,
            "allowed": sum(a["allowed"] for a in allowed),
            "synced_with_allow": sum(a["synced_early"] for a in allowed),
            "held_s": round(waited_s, 2),
            "synced": sum(r["synced"] for r in results),
            "all_synced_s": round(ended - released, 2) if ended else None,
            "loop_gap_max_ms": max(inside, default=None),
            "loop_gaps_over_50ms": sorted(round(g) for g in inside if g > 50),
            "longest_gap_parts_ms": gaps.get("longest_gap_parts_ms"),
            # the gaps over 50 ms from the release on, summed: loop CPU, waiting for a
            # core, other threads' CPU, collections
            "window_long_gap_parts_ms": long_gap_parts(before, stats),
            "loop_turns": stats.get("loop_turns"),
            "slow_consumers": stats.get("slow_consumers"),
            "load": os.getloadavg()[0], "machine": machine_description(),
        }))
    finally:
        for proc in procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
        cluster.stop()
        for pair in gates.values():
            for gate in pair:
                gate.shutdown()


if __name__ == "__main__":
    socket.setdefaulttimeout(None)
    main()
