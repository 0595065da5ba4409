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
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


from cluster_common import BenchCluster

from migratory.bench.procfs import CpuMeter, handle_sigterm, machine_description
from migratory.bench.publisher import publish_paced


def paced(port: int, rate: float, duration: float, size: int, drain: float = 10.0) -> dict:
    """``migratory bench``'s paced publisher (closures, absolute schedule) on one member."""
    r = publish_paced("127.0.0.1", port, rate=rate, duration=duration, size=size, subjects=16,
                      drain=drain)
    ack = r["ack_ms"]
    return {
        "sent": r["sent"], "acked": r["acks"], "unanswered": r["unanswered"],
        "statuses": r["statuses"], "late_max_ms": r["late_max_ms"],
        "p50": ack["p50"], "p90": ack["p90"], "p99": ack["p99"], "p999": ack["p99.9"],
        "max": ack["max"],
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
