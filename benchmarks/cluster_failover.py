"""Failover through a 3-seed Guaranteed cluster (real member processes, SIGKILL).

(a) subscriber resume: a raw subscriber on member X, a paced publisher
    (--sub-rate/s, closures) through member Z; SIGKILL X; the subscriber
    reconnects to member Y and resubscribes with its last (epoch, seq). Resume
    time = kill -> first live message after DATA_SYNC (target <= 1 s). Every
    acknowledged message must arrive exactly once, no gap, no duplicate.
(b) publish unavailability: a paced publisher (--pub-rate/s, closures, bounded
    outstanding) through a non-leader seed; SIGKILL the Raft leader; longest
    window without any PUBLISH_OK (target <= 1 s) and PUBLISH_FAILED reasons.
The killed member is restarted and waited ready between rounds.
Exit 0 = PASS, 1 = FAIL, 2 = could not run.
"""

from __future__ import annotations

import argparse
import json
import select
import socket
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import cbor2

sys.path.insert(0, str(Path(__file__).resolve().parent))

import contextlib
import itertools

from cluster_common import BenchCluster

from migratory.bench.procfs import handle_sigterm, machine_description
from migratory.bench.wsraw import decode_frames, masked, open_raw, publish_frame


class Publisher(threading.Thread):
    """Paced publishes with closures; records each PUBLISH_OK arrival time and position."""

    def __init__(
        self, port: int, subject: str, rate: float, max_outstanding: int, max_seconds: float
    ) -> None:
        super().__init__(daemon=True)
        self.port, self.subject, self.rate = port, subject, rate
        self.max_outstanding, self.max_seconds = max_outstanding, max_seconds
        self.stop_sending = threading.Event()
        self.ok_times: list[int] = []
        self.ok_positions: list[tuple[int, int]] = []
        self.sent_times: dict[str, int] = {}
        self.ok_sent: list[tuple[int, int]] = []  # (sent ns, ok ns)
        self.failed: Counter[str] = Counter()
        self.sent = 0
        self.skipped = 0  # not sent because max_outstanding was reached
        self.closed = ""
        self.error = ""

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:
            self.error = repr(exc)

    def _run(self) -> None:
        sock, buf = open_raw(self.port, "fo-pub")
        sock.setblocking(False)
        ep = select.epoll()
        ep.register(sock.fileno(), select.EPOLLIN)
        period = 1e9 / self.rate
        t0 = time.monotonic_ns()
        hard = time.monotonic() + self.max_seconds
        out = bytearray()
        i = 0
        try:
            while time.monotonic() < hard and (not self.stop_sending.is_set() or self.sent_times):
                if self.stop_sending.is_set():
                    timeout = 0.05
                else:
                    due = t0 + int(i * period)
                    now = time.monotonic_ns()
                    if now >= due:
                        if len(self.sent_times) < self.max_outstanding:
                            closure = str(i)
                            out += publish_frame(self.subject, b"%08d" % i + b"x" * 56, closure)
                            self.sent_times[closure] = time.monotonic_ns()
                            self.sent += 1
                        else:
                            self.skipped += 1
                        i += 1
                    timeout = max(0.0, (t0 + int(i * period) - time.monotonic_ns()) / 1e9)
                if out:
                    with contextlib.suppress(BlockingIOError):
                        del out[: sock.send(out)]
                if self.closed:
                    time.sleep(timeout)
                    continue
                for _fd, _ev in ep.poll(timeout):
                    try:
                        data = sock.recv(262144)
                    except BlockingIOError:
                        continue
                    except OSError as exc:
                        data, self.closed = b"", repr(exc)
                    now = time.monotonic_ns()
                    if not data:
                        self.closed = self.closed or "closed"
                        ep.unregister(sock.fileno())
                        break
                    ops_, buf = decode_frames(buf + data)
                    for op in ops_:
                        if isinstance(op, tuple) or op.get("op") != "publish_status":
                            continue
                        sent_ns = self.sent_times.pop(op.get("closure", ""), None)
                        if op.get("status") == "PUBLISH_OK":
                            self.ok_times.append(now)
                            self.ok_positions.append((op.get("epoch"), op.get("seq")))
                            if sent_ns is not None:
                                self.ok_sent.append((sent_ns, now))
                        else:
                            self.failed[f"{op.get('status')}: {op.get('reason')}"] += 1
                if self.closed:
                    break
        finally:
            ep.close()
            sock.close()


class Subscriber(threading.Thread):
    """Subscribes on ports[0]; on TCP drop resubscribes with its last position on ports[1]."""

    def __init__(self, ports: list[int], subject: str, max_seconds: float) -> None:
        super().__init__(daemon=True)
        self.ports, self.subject, self.max_seconds = ports, subject, max_seconds
        self.ready = threading.Event()
        self.stop = threading.Event()
        self.seqs: list[tuple[int, int]] = []
        self.types: Counter[str] = Counter()
        self.position: tuple[int, int] | None = None
        self.t_drop = self.t_reconnected = self.t_sync = self.t_first_live = 0
        self.reconnect_errors: list[str] = []
        self.statuses: list[str] = []
        self.error = ""

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:
            self.error = repr(exc)

    def _subscribe(self, port: int) -> tuple[socket.socket, bytes]:
        sock, buf = open_raw(port, "fo-sub")
        req: dict = {"subject": self.subject}
        if self.position is not None:
            req["epoch"], req["seq"] = self.position
        sock.sendall(masked(cbor2.dumps({"op": "subscribe", "subjects": [req]})))
        sock.settimeout(0.1)
        return sock, buf

    def _run(self) -> None:
        hard = time.monotonic() + self.max_seconds
        sock, buf = self._subscribe(self.ports[0])
        resumed = False
        try:
            while time.monotonic() < hard and not self.stop.is_set():
                try:
                    data = sock.recv(262144)
                except TimeoutError:
                    continue
                except OSError:
                    data = b""
                now = time.monotonic_ns()
                if not data:
                    if resumed:
                        self.error = "second disconnect"
                        return
                    self.t_drop = now
                    sock.close()
                    buf = b""
                    deadline = time.monotonic() + 10
                    while time.monotonic() < deadline:
                        try:
                            sock, buf = self._subscribe(self.ports[1])
                            break
                        except (OSError, ConnectionError, TimeoutError) as exc:
                            self.reconnect_errors.append(repr(exc))
                            time.sleep(0.02)
                    else:
                        self.error = "could not reconnect"
                        return
                    self.t_reconnected = time.monotonic_ns()
                    resumed = True
                    continue
                ops_, buf = decode_frames(buf + data)
                for op in ops_:
                    if isinstance(op, tuple):
                        self.statuses.append(f"close {op[1]}")
                        continue
                    kind = op.get("op")
                    if kind == "status":
                        self.statuses.append(op.get("status"))
                        if op.get("status") == "SUBSCRIBE_ALLOW" and not resumed:
                            self.ready.set()
                        if op.get("status") == "DATA_SYNC" and resumed and not self.t_sync:
                            self.t_sync = now
                        continue
                    msgs = (
                        op.get("messages", [])
                        if kind == "batch"
                        else [op]
                        if kind == "message"
                        else []
                    )
                    for m in msgs:
                        pos = (m.get("epoch"), m.get("seq"))
                        self.seqs.append(pos)
                        self.position = pos
                        self.types[m.get("type")] += 1
                        if (
                            resumed
                            and self.t_sync
                            and not self.t_first_live
                            and m.get("type") == "update"
                        ):
                            self.t_first_live = now
        finally:
            sock.close()


def check_sequence(seqs: list[tuple[int, int]], acked: list[tuple[int, int]]) -> dict:
    dups = len(seqs) - len(set(seqs))
    gaps = 0
    for (e0, s0), (e1, s1) in itertools.pairwise(seqs):
        if e0 == e1 and s1 != s0 + 1 and s1 > s0:
            gaps += 1
    missing_acked = len(set(acked) - set(seqs))
    return {
        "received": len(seqs),
        "duplicates": dups,
        "gaps": gaps,
        "acked": len(acked),
        "acked_not_received": missing_acked,
        "epochs": sorted({e for e, _ in seqs}),
    }


def round_resume(cluster: BenchCluster, rnd: int, args: argparse.Namespace) -> dict:
    x, y, z = rnd % 3, (rnd + 1) % 3, (rnd + 2) % 3
    leader = cluster.leader()
    subject = f"/bench/failover{rnd}"
    sub = Subscriber([cluster.port(x), cluster.port(y)], subject, 60)
    sub.start()
    if not sub.ready.wait(10):
        raise RuntimeError(f"subscriber not ready: {sub.error}")
    pub = Publisher(cluster.port(z), subject, args.sub_rate, 5000, 60)
    pub.start()
    time.sleep(args.before)
    t_kill = cluster.kill(x)
    time.sleep(args.after)
    pub.stop_sending.set()
    pub.join(20)
    time.sleep(1.0)
    sub.stop.set()
    sub.join(5)
    seq = check_sequence(sub.seqs, pub.ok_positions)
    r = {
        "round": rnd,
        "killed": x,
        "killed_was_leader": x == leader,
        "resubscribed_to": y,
        "publisher_on": z,
        "drop_ms": (sub.t_drop - t_kill) / 1e6 if sub.t_drop else None,
        "reconnected_ms": (sub.t_reconnected - t_kill) / 1e6 if sub.t_reconnected else None,
        "data_sync_ms": (sub.t_sync - t_kill) / 1e6 if sub.t_sync else None,
        "resume_ms": (sub.t_first_live - t_kill) / 1e6 if sub.t_first_live else None,
        "types": dict(sub.types),
        "published": pub.sent,
        "publish_failed": dict(pub.failed),
        "publisher_unanswered": len(pub.sent_times),
        "reconnect_errors": sub.reconnect_errors[:3],
        "errors": [e for e in (sub.error, pub.error, pub.closed) if e],
        **seq,
    }
    r["pass"] = (
        r["resume_ms"] is not None
        and r["resume_ms"] <= args.target_ms
        and seq["duplicates"] == 0
        and seq["gaps"] == 0
        and seq["acked_not_received"] == 0
        and not r["errors"]
    )
    restart(cluster, x)
    return r


def round_leader(cluster: BenchCluster, rnd: int, args: argparse.Namespace) -> dict:
    leader = cluster.leader()
    via = (leader + 1) % 3
    pub = Publisher(
        cluster.port(via), f"/bench/leaderkill{rnd}", args.pub_rate, args.outstanding, 90
    )
    pub.start()
    time.sleep(args.before)
    t_kill = cluster.kill(leader)
    time.sleep(args.after)
    pub.stop_sending.set()
    pub.join(60)
    oks = sorted(t for t in pub.ok_times if t >= t_kill - int(args.before * 1e9 / 2))
    points = [t_kill - int(args.before * 1000000000.0 / 2), *oks] if oks else []
    longest = max((b - a for a, b in itertools.pairwise(points)), default=None)
    after_kill = [t for t in oks if t >= t_kill]
    new_sent = [ok for s, ok in pub.ok_sent if s >= t_kill]
    r = {
        "round": rnd,
        "killed_leader": leader,
        "published_via": via,
        "new_leader": cluster.leader(),
        "longest_no_ok_ms": longest / 1e6 if longest is not None else None,
        "first_ok_after_kill_ms": (after_kill[0] - t_kill) / 1e6 if after_kill else None,
        "first_ok_for_post_kill_publish_ms": (min(new_sent) - t_kill) / 1e6 if new_sent else None,
        "sent": pub.sent,
        "ok": len(pub.ok_times),
        "failed": dict(pub.failed),
        "failed_total": sum(pub.failed.values()),
        "unanswered": len(pub.sent_times),
        "skipped_outstanding_full": pub.skipped,
        "errors": [e for e in (pub.error, pub.closed) if e],
    }
    r["pass"] = (
        r["longest_no_ok_ms"] is not None
        and r["longest_no_ok_ms"] <= args.target_ms
        and r["unanswered"] == 0
        and not r["errors"]
    )
    restart(cluster, leader)
    return r


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def restart(cluster: BenchCluster, i: int) -> None:
    cluster.start(i)
    cluster.wait_ready(timeout=60)
    cluster.leader()
    time.sleep(0.5)


def run(args: argparse.Namespace) -> dict:
    extra = dict(setting.split("=", 1) for setting in args.set)
    cluster = BenchCluster("cluster-failover", extra=extra or None)
    resume, leader_rounds = [], []
    try:
        cluster.start_all()
        ready_s = cluster.wait_ready()
        print(f"cluster ready in {ready_s:.1f} s, logs {cluster.log_dir}", flush=True)
        if args.part in ("a", "both"):
            for rnd in range(args.rounds):
                r = round_resume(cluster, rnd, args)
                resume.append(r)
                print(
                    f"(a) round {rnd}: killed member {r['killed']}"
                    f"{' (leader)' if r['killed_was_leader'] else ''}, "
                    f"drop {_ms(r['drop_ms'])} ms, "
                    f"DATA_SYNC {_ms(r['data_sync_ms'])} ms, first live {_ms(r['resume_ms'])} ms; "
                    f"received {r['received']} (types {r['types']}), acked {r['acked']}, "
                    f"dups {r['duplicates']}, gaps {r['gaps']}, acked-not-received "
                    f"{r['acked_not_received']}; publish failed {r['publish_failed']}; "
                    f"errors {r['errors']} -> {'PASS' if r['pass'] else 'FAIL'}",
                    flush=True,
                )
        if args.part in ("b", "both"):
            for rnd in range(args.rounds):
                r = round_leader(cluster, rnd, args)
                leader_rounds.append(r)
                print(
                    f"(b) round {rnd}: killed leader {r['killed_leader']} (publishing via "
                    f"{r['published_via']}, new leader {r['new_leader']}): longest without "
                    f"PUBLISH_OK {_ms(r['longest_no_ok_ms'])} ms, first OK after kill "
                    f"{_ms(r['first_ok_after_kill_ms'])} ms, first OK of a post-kill publish "
                    f"{_ms(r['first_ok_for_post_kill_publish_ms'])} ms; sent {r['sent']}, OK "
                    f"{r['ok']}, FAILED {r['failed_total']} {r['failed']}, unanswered "
                    f"{r['unanswered']}, errors {r['errors']} -> "
                    f"{'PASS' if r['pass'] else 'FAIL'}",
                    flush=True,
                )
    finally:
        cluster.stop()
    return {
        "resume": resume,
        "leader_kill": leader_rounds,
        "settings": vars(args),
        "log_dir": str(cluster.log_dir),
        "log_counts": cluster.log_summary(),
        "machine": machine_description(),
        "pass_resume": all(r["pass"] for r in resume),
        "pass_leader_kill": all(r["pass"] for r in leader_rounds),
        "pass": all(r["pass"] for r in resume + leader_rounds),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--part", choices=("a", "b", "both"), default="both")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sub-rate", type=float, default=200)
    p.add_argument("--pub-rate", type=float, default=500)
    p.add_argument("--outstanding", type=int, default=2000)
    p.add_argument("--before", type=float, default=2.0, help="s of load before the kill")
    p.add_argument("--after", type=float, default=4.0, help="s of load after the kill")
    p.add_argument("--target-ms", type=float, default=1000)
    p.add_argument("--json")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a config key for every member, e.g. ClusterElectionTimeout=600")
    args = p.parse_args()
    bad = [s for s in args.set if "=" not in s]
    if bad:
        p.error(f"--set takes KEY=VALUE, got {bad[0]!r}")
    handle_sigterm()
    try:
        r = run(args)
    except (RuntimeError, TimeoutError, OSError, KeyboardInterrupt, SystemExit) as exc:
        print(f"could not run: {exc!r}", file=sys.stderr)
        return 2
    resume = [_ms(x["resume_ms"]) for x in r["resume"]]
    gaps = [_ms(x["longest_no_ok_ms"]) for x in r["leader_kill"]]
    if r["resume"]:
        print(
            f"(a) resume ms per round {resume}: target <= {args.target_ms} ms, no gap/dup: "
            f"{'PASS' if r['pass_resume'] else 'FAIL'}"
        )
    if r["leader_kill"]:
        print(
            f"(b) longest no-PUBLISH_OK window ms per round {gaps}: target <= "
            f"{args.target_ms} ms: {'PASS' if r['pass_leader_kill'] else 'FAIL'}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=2, sort_keys=True, default=str))
    return 0 if r["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
