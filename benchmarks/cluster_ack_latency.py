"""PUBLISH_OK latency at a paced rate through a 3-seed Guaranteed cluster.

One raw publisher connection at --rate publishes/s (absolute schedule, a
closure per publish), first through a non-leader seed, then through the
leader. Targets (issue 8): p50 <= 5 ms, p99 <= 20 ms and p99.9 <= 30 ms on both;
the max is reported.
Exit 0 = PASS, 1 = FAIL, 2 = could not run.
"""

from __future__ import annotations

import argparse
import json
import select
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import contextlib

from cluster_common import BenchCluster, decode_frames, open_raw, pct, publish_frame

from migratory.bench.procfs import CpuMeter, handle_sigterm, machine_description


def paced(port: int, rate: float, duration: float, size: int, drain: float = 10.0) -> dict:
    sock, buf = open_raw(port, "lat")
    sock.setblocking(False)
    ep = select.epoll()
    ep.register(sock.fileno(), select.EPOLLIN)
    total = int(rate * duration)
    period = 1e9 / rate
    sent_at: dict[str, int] = {}
    lat: list[float] = []
    statuses: Counter[str] = Counter()
    late_max = 0
    out = bytearray()
    pad = b"x" * max(0, size - 8)
    t0 = time.monotonic_ns() + 5_000_000
    hard = time.monotonic() + duration * 2 + drain + 10

    def read(timeout: float) -> None:
        nonlocal buf
        for _fd, _ev in ep.poll(timeout):
            try:
                data = sock.recv(262144)
            except BlockingIOError:
                continue
            now = time.monotonic_ns()
            if not data:
                statuses["connection closed"] += 1
                ep.unregister(sock.fileno())
                return
            ops_, buf = decode_frames(buf + data)
            for op in ops_:
                if isinstance(op, tuple):
                    statuses[f"close {op[1]}"] += 1
                    continue
                if op.get("op") != "publish_status":
                    continue
                status = op.get("status", "?")
                statuses[status if status == "PUBLISH_OK" else f"{status}: {op.get('reason')}"] += 1
                t = sent_at.pop(op.get("closure", ""), None)
                if t is not None and status == "PUBLISH_OK":
                    lat.append((now - t) / 1e6)

    sent = 0
    try:
        while sent < total and time.monotonic() < hard:
            due = t0 + int(sent * period)
            now = time.monotonic_ns()
            if now < due:
                read((due - now) / 1e9)
                continue
            late_max = max(late_max, now - due)
            closure = str(sent)
            out += publish_frame(f"/bench/lat{sent % 16}", b"%08d" % sent + pad, closure)
            sent_at[closure] = time.monotonic_ns()
            with contextlib.suppress(BlockingIOError):
                del out[: sock.send(out)]
            sent += 1
        end = time.monotonic() + drain
        while sent_at and time.monotonic() < min(end, hard):
            if out:
                with contextlib.suppress(BlockingIOError):
                    del out[: sock.send(out)]
            read(0.05)
    finally:
        ep.close()
        sock.close()
    return {
        "sent": sent, "acked": len(lat), "unanswered": len(sent_at),
        "statuses": dict(statuses), "late_max_ms": late_max / 1e6,
        "p50": pct(lat, 0.50), "p90": pct(lat, 0.90), "p99": pct(lat, 0.99),
        "p999": pct(lat, 0.999), "max": max(lat) if lat else float("nan"),
    }


def run(args: argparse.Namespace) -> dict:
    extra = {"GcThresholds": args.gc} if args.gc else None
    cluster = BenchCluster("cluster-ack-latency", extra=extra)
    results = {}
    try:
        cluster.start_all()
        ready_s = cluster.wait_ready()
        leader = cluster.leader()
        follower = (leader + 1) % cluster.members
        print(f"cluster ready in {ready_s:.1f} s, leader member {leader}, logs {cluster.log_dir}",
              flush=True)
        for name, member in (("via non-leader seed", follower), ("via leader", leader)):
            meter = CpuMeter({f"member{i}": cluster.pid(i) for i in range(cluster.members)})
            before = cluster.status(member).get("raft_commands", {})
            meter.start()
            r = paced(cluster.port(member), args.rate, args.duration, args.size)
            r["cpu"] = meter.stop()
            after = cluster.status(member).get("raft_commands", {})
            commands = after.get("commands", 0) - before.get("commands", 0)
            r["raft_commands"] = commands
            r["publishes_per_command"] = (
                (after.get("publishes", 0) - before.get("publishes", 0)) / commands
                if commands else None
            )
            r["gc"] = {i: cluster.stats(i).get("gc") for i in range(cluster.members)}
            r["member"] = member
            r["leader_after"] = cluster.leader()
            r["pass"] = (r["p50"] <= args.p50 and r["p99"] <= args.p99
                         and r["p999"] <= args.p999
                         and r["unanswered"] == 0 and r["acked"] == r["sent"])
            results[name] = r
            print(f"{name} (member {member}): {fmt(r)}", flush=True)
    finally:
        cluster.stop()
    return {"runs": results, "leader": leader, "settings": vars(args),
            "log_dir": str(cluster.log_dir), "log_counts": cluster.log_summary(),
            "machine": machine_description(),
            "pass": all(r["pass"] for r in results.values())}


def gc_summary(per_member: dict) -> str:
    return ", ".join(
        f"{i}: {g['collections']}/{g['full_collections']}/{g['max_ms']:.0f}"
        for i, g in per_member.items() if g
    )


def fmt(r: dict) -> str:
    cpu = ", ".join(f"{k} {v:.0f} %" for k, v in r["cpu"].items() if k.startswith("member"))
    return (f"{r['acked']:,}/{r['sent']:,} acked, p50 {r['p50']:.1f}, p90 {r['p90']:.1f}, "
            f"p99 {r['p99']:.1f}, p99.9 {r['p999']:.1f}, max {r['max']:.1f} ms; "
            f"statuses {r['statuses']}; {r['raft_commands']:,} Raft commands "
            f"({r['publishes_per_command'] or 0:.2f} publishes each); "
            f"sender late max {r['late_max_ms']:.1f} ms; CPU {cpu}; "
            f"machine {r['cpu']['machine']:.0f} %, other {r['cpu']['other']:.0f} %; "
            f"GC pauses (collections/full/max ms per member) {gc_summary(r['gc'])} -> "
            f"{'PASS' if r['pass'] else 'FAIL'}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rate", type=float, default=1000)
    p.add_argument("--duration", type=float, default=15)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--p50", type=float, default=5.0)
    p.add_argument("--p99", type=float, default=20.0)
    p.add_argument("--p999", type=float, default=30.0)
    p.add_argument("--gc", help="GcThresholds for the members (default: the server's)")
    p.add_argument("--json")
    args = p.parse_args()
    handle_sigterm()
    try:
        r = run(args)
    except (RuntimeError, TimeoutError, OSError, KeyboardInterrupt, SystemExit) as exc:
        print(f"could not run: {exc!r}", file=sys.stderr)
        return 2
    print(f"targets p50 <= {args.p50} ms, p99 <= {args.p99} ms, p99.9 <= {args.p999} ms: "
          f"{'PASS' if r['pass'] else 'FAIL'}")
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=2, sort_keys=True, default=str))
    return 0 if r["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
