"""Acknowledged publishes/s through a 3-seed Guaranteed cluster (target >= 25,000/s).

Several publisher processes, each with a few raw WebSocket connections spread
over the members, keep up to --window publishes with closures in flight per
connection. Replies are counted by scanning the bytes for ``PUBLISH_OK`` /
``PUBLISH_FAILED`` (no decoding). Exit 0 = PASS, 1 = FAIL, 2 = could not run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import select
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster_common import BenchCluster

from migratory.bench.loadgen import receive, stop_processes
from migratory.bench.procfs import CpuMeter, die_with_parent, handle_sigterm, machine_description
from migratory.bench.wsraw import open_raw, publish_frame

OK = b"PUBLISH_OK"
FAILED = b"PUBLISH_FAILED"


def _count(tail: bytes, data: bytes, word: bytes) -> tuple[int, bytes]:
    buf = tail + data
    return buf.count(word), buf[-(len(word) - 1):]


def publisher(ctrl, k: int, ports: list[int], conns: int, window: int, size: int,
              subjects: int, warmup: float, duration: float, drain: float) -> None:
    die_with_parent()
    socks = []
    try:
        for c in range(conns):
            port = ports[(k * conns + c) % len(ports)]
            sock, _ = open_raw(port, f"tp-{k}-{c}")
            sock.setblocking(False)
            socks.append(sock)
    except Exception as exc:
        ctrl.send(("ready", f"setup failed: {exc}"))
        return
    pool = []
    for i in range(1000):
        subject = f"/bench/tp{(k * 7 + i) % subjects}"
        content = (b"%08d" % i) + b"x" * max(0, size - 8)
        pool.append(publish_frame(subject, content, str(i)))
    ctrl.send(("ready", None))
    if not ctrl.poll(120) or ctrl.recv()[0] != "go":
        return
    ep = select.epoll()
    fds = {}
    state = {}
    for s in socks:
        fds[s.fileno()] = s
        state[s.fileno()] = {"sent": 0, "ok": 0, "fail": 0, "tail_ok": b"", "tail_f": b"",
                             "out": bytearray(), "closed": False, "p": 0}
        ep.register(s.fileno(), select.EPOLLIN)
    t0 = time.monotonic()
    t_measure = t0 + warmup
    t_end = t_measure + duration
    hard = t_end + drain
    mark_start = None
    mark_end = None
    refill = max(1, window // 4)
    fail_examples: list[str] = []

    def totals() -> tuple[int, int, int]:
        return (sum(v["ok"] for v in state.values()), sum(v["fail"] for v in state.values()),
                sum(v["sent"] for v in state.values()))

    def fill(fd: int) -> None:
        st = state[fd]
        inflight = st["sent"] - st["ok"] - st["fail"]
        if st["closed"] or window - inflight < refill:
            return
        n = window - inflight
        p = st["p"]
        for _ in range(n):
            st["out"] += pool[p]
            p = (p + 1) % len(pool)
        st["p"] = p
        st["sent"] += n

    def flush(fd: int) -> None:
        st = state[fd]
        if st["out"] and not st["closed"]:
            try:
                del st["out"][: fds[fd].send(st["out"])]
            except BlockingIOError:
                pass
            except OSError:
                st["closed"] = True

    sending = True
    iterations = 0
    while time.monotonic() < hard and iterations < 50_000_000:
        iterations += 1
        now = time.monotonic()
        if mark_start is None and now >= t_measure:
            mark_start = (now, *totals())
        if sending and now >= t_end:
            mark_end = (now, *totals())
            sending = False
        if sending:
            for fd in fds:
                fill(fd)
                flush(fd)
        else:
            inflight = sum(v["sent"] - v["ok"] - v["fail"] for v in state.values()
                           if not v["closed"])
            if inflight <= 0:
                break
            for fd in fds:
                flush(fd)
        for fd, _ev in ep.poll(0.05):
            st = state[fd]
            try:
                data = fds[fd].recv(262144)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                st["closed"] = True
                ep.unregister(fd)
                continue
            n, st["tail_ok"] = _count(st["tail_ok"], data, OK)
            st["ok"] += n
            n, st["tail_f"] = _count(st["tail_f"], data, FAILED)
            st["fail"] += n
            if n and len(fail_examples) < 5:
                i = data.find(FAILED)
                fail_examples.append(data[max(0, i - 20): i + 120].decode("ascii", "replace"))
    if mark_start is None:
        mark_start = (time.monotonic(), *totals())
    if mark_end is None:
        mark_end = (time.monotonic(), *totals())
    ok, fail, sent = totals()
    ep.close()
    for s in socks:
        s.close()
    ctrl.send(("done", {
        "window_seconds": mark_end[0] - mark_start[0],
        "ok_in_window": mark_end[1] - mark_start[1],
        "failed_in_window": mark_end[2] - mark_start[2],
        "ok": ok, "failed": fail, "sent": sent,
        "unanswered": sent - ok - fail,
        "closed": sum(1 for v in state.values() if v["closed"]),
        "fail_examples": fail_examples,
    }))


def run(args: argparse.Namespace) -> dict:
    procs: list[mp.Process] = []
    launcher = [str(Path(__file__).resolve().parent / "cluster_patched_member.py")]
    cluster = BenchCluster("cluster-throughput", launcher=launcher if args.patched else None)
    try:
        cluster.start_all()
        ready_s = cluster.wait_ready()
        leader = cluster.leader()
        print(f"cluster ready in {ready_s:.1f} s, leader member {leader}, logs {cluster.log_dir}",
              flush=True)
        ports = [cluster.port(i) for i in range(cluster.members)]
        pipes = []
        for k in range(args.procs):
            parent, child = mp.Pipe()
            proc = mp.Process(target=publisher, args=(
                child, k, ports, args.conns, args.window, args.size, args.subjects,
                args.warmup, args.duration, args.drain), daemon=True)
            proc.start()
            procs.append(proc)
            pipes.append(parent)
        for msg in receive(pipes, "ready", 60):
            if msg[1]:
                raise RuntimeError(msg[1])
        meter = CpuMeter({f"member{i}": cluster.pid(i) for i in range(cluster.members)})
        for k, proc in enumerate(procs):
            meter.add(f"load{k}", proc.pid)
        for pipe in pipes:
            pipe.send(("go",))
        time.sleep(args.warmup)
        meter.start()
        time.sleep(args.duration)
        cpu = meter.stop()
        stats = [m[1] for m in receive(pipes, "done", args.drain + 60)]
        statuses = {}
        for i in range(cluster.members):
            try:
                statuses[i] = cluster.status(i).get("publishing")
            except OSError:
                statuses[i] = None
    finally:
        stop_processes(procs)
        cluster.stop()
    window = max(s["window_seconds"] for s in stats)
    ok = sum(s["ok_in_window"] for s in stats)
    rate = ok / window if window > 0 else 0.0
    failed = sum(s["failed"] for s in stats)
    result = {
        "acks_per_second": rate,
        "ok_in_window": ok, "window_seconds": window,
        "ok_total": sum(s["ok"] for s in stats), "failed_total": failed,
        "unanswered": sum(s["unanswered"] for s in stats),
        "closed_connections": sum(s["closed"] for s in stats),
        "cpu": cpu, "leader": leader, "per_process": stats, "publishing_status": statuses,
        "settings": vars(args), "log_dir": str(cluster.log_dir),
        "log_counts": cluster.log_summary(), "machine": machine_description(),
    }
    result["pass"] = rate >= args.target and failed == 0 and result["unanswered"] == 0
    return result


def report(r: dict) -> None:
    cpu = r["cpu"]
    members = ", ".join(f"{k} {v:.0f} %" for k, v in cpu.items() if k.startswith("member"))
    load = sum(v for k, v in cpu.items() if k.startswith("load"))
    print(f"acknowledged publishes: {r['acks_per_second']:,.0f}/s "
          f"({r['ok_in_window']:,} in {r['window_seconds']:.1f} s); "
          f"total OK {r['ok_total']:,}, FAILED {r['failed_total']}, "
          f"unanswered {r['unanswered']}, closed conns {r['closed_connections']}")
    examples = [e for s in r["per_process"] for e in s.get("fail_examples", [])]
    if examples:
        print(f"PUBLISH_FAILED examples (raw bytes): {examples[:3]}")
    print(f"CPU: {members} (leader = member{r['leader']}); load {load:.0f} %; "
          f"machine {cpu['machine']:.0f} % of {100 * int(r['machine']['nproc'])} %, "
          f"softirq {cpu['softirq']:.0f} %, other {cpu['other']:.0f} %")
    pub = [v for v in r["publishing_status"].values() if v]
    if pub:
        batches = max(v.get("applied_clsn", 0) for v in pub)
        total = sum(v.get("acknowledged", 0) for v in pub)
        print(f"Raft commands (committed batches): {batches:,}, "
              f"{total / max(batches, 1):,.0f} publishes per batch on average")
    print(f"log counts {r['log_counts']} (pysyncobj CRITICAL lines counted as 'critical'), "
          f"logs {r['log_dir']}")
    print(f"target >= {r['settings']['target']:,}/s: {'PASS' if r['pass'] else 'FAIL'}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--procs", type=int, default=3, help="publisher processes")
    p.add_argument("--conns", type=int, default=3, help="connections per publisher process")
    p.add_argument("--window", type=int, default=300, help="publishes in flight per connection")
    p.add_argument("--size", type=int, default=64, help="content bytes")
    p.add_argument("--subjects", type=int, default=64)
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--drain", type=float, default=20.0)
    p.add_argument("--target", type=float, default=25_000)
    p.add_argument("--patched", action="store_true",
                   help="EXPERIMENT: run members with cluster_patched_member.py (suggested fixes)")
    p.add_argument("--json")
    args = p.parse_args()
    handle_sigterm()
    try:
        r = run(args)
    except (RuntimeError, TimeoutError, OSError, KeyboardInterrupt, SystemExit) as exc:
        print(f"could not run: {exc!r}", file=sys.stderr)
        return 2
    report(r)
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=2, sort_keys=True, default=str))
    return 0 if r["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
