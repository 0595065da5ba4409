#!/usr/bin/env python3
"""Fan-out benchmark: one server, N WebSocket subscribers of one subject, one publisher.

Default load: 1000 subscribers of ``/bench/fanout``, 100-byte contents at 100
messages/s for 30 s, i.e. 100,000 deliveries/s and 3,000,000 in all. Target:
every delivery arrives, end-to-end latency p99 <= 50 ms.

    .venv/bin/python benchmarks/fanout.py [--duration 30] [--set BatchTime=20] [--json out.json]

How it measures:

* The publisher (its own process, one raw WebSocket) stamps each content with
  ``@@TS`` + 19 digits of ``time.monotonic_ns()`` taken just before the send,
  on an absolute schedule (message i is due at t0 + i/rate, no drift).
* Subscriber processes (``--procs``) hold the subscriber sockets in one epoll
  each. After each ``recv`` they read the clock, find every stamp in the
  chunk with one compiled-regex scan and bucket ``now - stamp`` into a 0.1 ms
  histogram (plus the exact maximum). No CBOR decoding, no frame objects.
* Server CPU % comes from /proc/PID/stat (utime + stime) over the publishing
  window; the load processes' CPU is measured the same way and reported too.
* Each subscriber confirms ``SUBSCRIBE_ALLOW`` before the publisher starts;
  after the last publish the subscribers drain for at most ``--drain`` s.

The server runs as a subprocess (``python -m migratory serve``), its log goes to
``benchmarks/results/``; it is stopped by PID (SIGINT, then SIGKILL) at the end,
on errors and on Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import multiprocessing.connection as mpc
import random
import re
import select
import signal
import sys
import time
from collections import Counter
from typing import Any

import cbor2
from _loadgen import (
    BUCKET_NS,
    BUCKETS,
    OPCODE_CLOSE,
    RECV_SIZE,
    CpuMeter,
    RawConn,
    ServerProcess,
    close_all,
    close_code,
    dense,
    die_with_parent,
    masked,
    merge_hist,
    open_connections,
    percentiles_ms,
    raise_nofile,
    receive,
    rss_kib,
    run_with_server,
    server_stats,
    sparse,
    split,
    walk_frames,
)

from migratory.protocol.websocket import encode_binary

SUBJECT = "/bench/fanout"
MARK = b"@@TS"
STAMP_END = len(MARK) + 19  # the stamp's digits end this far after the marker
STAMP = re.compile(re.escape(MARK) + rb"(\d{19})")
QUANTILES = (0.5, 0.9, 0.99, 0.999)
TARGET_P99_MS = 50.0


# --- subscriber processes -------------------------------------------------------------------


def subscriber_main(
    ctrl: mpc.Connection,
    host: str,
    port: int,
    first: int,
    count: int,
    setup_timeout: float,
    lifetime: float,
) -> None:
    """Open ``count`` subscribers, report ready, count deliveries until told to finish."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    die_with_parent()
    raise_nofile()
    hard_deadline = time.monotonic() + lifetime
    subscribe = masked(cbor2.dumps({"op": "subscribe", "subjects": [{"subject": SUBJECT}]}))

    def frames_for(index: int) -> bytes:
        connect = {"op": "connect", "version": 1, "client": f"bench-{index}"}
        return masked(cbor2.dumps(connect)) + subscribe

    setup = open_connections(
        host,
        port,
        range(first, first + count),
        frames_for,
        ready_marker=b"SUBSCRIBE_ALLOW",
        timeout=setup_timeout,
    )
    ctrl.send(("ready", len(setup.ready), dict(setup.failures), setup.seconds))
    try:
        result = count_deliveries(setup.ready, ctrl, hard_deadline)
    finally:
        close_all(setup.ready)
    ctrl.send(("result", result))


def count_deliveries(conns: list[RawConn], ctrl: mpc.Connection, hard_deadline: float) -> dict:
    """The hot loop: recv, find the stamps, bucket latencies. No CBOR decoding.

    One C-level regex scan per ``recv`` (:func:`scan_stamps`) finds every
    stamp in the chunk, so a batch of several frames, or a frame carrying
    several messages, costs one call; it measured twice as fast as walking the
    frame headers in Python. A close frame is recognised from the last chunk
    when the connection ends.
    """
    ep = select.epoll()
    by_fd: dict[int, RawConn] = {}
    for conn in conns:
        by_fd[conn.sock.fileno()] = conn
        ep.register(conn.sock.fileno(), select.EPOLLIN)
    ctrl_fd = ctrl.fileno()
    ep.register(ctrl_fd, select.EPOLLIN)
    hist = [0] * BUCKETS
    top = BUCKETS - 1
    max_ns = 0
    total = 0
    closes: Counter[str] = Counter()
    expected_each: int | None = None
    drain_until = hard_deadline
    open_conns = len(conns)
    recvs = 0
    polls = 0
    monotonic_ns = time.monotonic_ns
    scan = scan_stamps
    for conn in conns:  # bytes that followed SUBSCRIBE_ALLOW (none expected)
        stamps, conn.buf = scan(conn.buf)
        conn.count = len(stamps)
    try:
        while True:
            now_s = time.monotonic()
            if now_s >= hard_deadline:
                closes["load generator lifetime exceeded"] += 1
                break
            if expected_each is not None and (
                now_s >= drain_until or total >= expected_each * open_conns
            ):
                break
            events = ep.poll(0.05)
            polls += 1
            for fd, _ev in events:
                conn = by_fd.get(fd)
                if conn is None:
                    if fd == ctrl_fd:
                        msg = ctrl.recv()
                        if msg[0] == "finish":
                            expected_each = msg[1]
                            drain_until = min(time.monotonic() + msg[2], hard_deadline)
                    continue
                try:
                    data = conn.sock.recv(RECV_SIZE)
                except BlockingIOError:
                    continue
                except OSError as exc:
                    data = b""
                    conn.closed = f"recv error: {exc.strerror}"
                now = monotonic_ns()
                recvs += 1
                if not data:
                    closes[conn.closed or ended_with(conn.last)] += 1
                    ep.unregister(fd)
                    del by_fd[fd]
                    open_conns -= 1
                    continue
                stamps, conn.buf = scan(conn.buf + data if conn.buf else data)
                got = 0
                for stamp in stamps:
                    lat = now - int(stamp)
                    bucket = lat // BUCKET_NS
                    hist[bucket if bucket < top else top] += 1
                    if lat > max_ns:
                        max_ns = lat
                    got += 1
                conn.last = data
                conn.count += got
                total += got
    finally:
        ep.close()
    per_conn = Counter(conn.count for conn in conns)
    return {
        "subscribers": len(conns),
        "received": total,
        "max_ns": max_ns,
        "hist": sparse(hist),
        "per_conn_counts": dict(per_conn),
        "closes": dict(closes),
        "recvs": recvs,
        "polls": polls,
    }


def scan_stamps(data: bytes) -> tuple[list[bytes], bytes]:
    """The stamps (19 digits each) in ``data``, and the bytes to carry into the next chunk.

    Frame boundaries do not matter, only the marker does. A stamp cut by the
    end of the chunk starts with ``@`` within its last ``STAMP_END - 1`` bytes;
    everything from the first ``@`` there on is carried over. A carry is
    shorter than a stamp, so no stamp is ever counted twice.
    """
    i = data.find(b"@", -(STAMP_END - 1))  # a negative start is clamped to 0 on short data
    return STAMP.findall(data), (data[i:] if i >= 0 else b"")


def self_test(rounds: int = 200) -> None:
    """Split a stream of server frames at random points; every stamp must be found once."""
    rng = random.Random(1)
    for _ in range(rounds):
        count = rng.randint(1, 2000)
        stream = b"".join(
            encode_binary(
                cbor2.dumps(
                    {
                        "op": "message",
                        "subject": SUBJECT,
                        "content": MARK + b"%019d" % (10**18 + i) + b"@" * 77,
                        "epoch": rng.getrandbits(47),
                        "seq": i,
                    }
                )
            )
            for i in range(count)
        )
        found: list[int] = []
        pos = 0
        carry = b""
        while pos < len(stream):
            step = rng.choice((1, 2, 5, 22, 23, 24, 100, RECV_SIZE, rng.randint(1, 5000)))
            stamps, carry = scan_stamps(carry + stream[pos : pos + step])
            found += (int(s) for s in stamps)
            pos += step
        assert found == [10**18 + i for i in range(count)], "stamp scanner lost or doubled one"
    print(f"self-test: stamp scanner OK over {rounds} randomly split streams")


def ended_with(last: bytes) -> str:
    """How a connection ended, judging by the last bytes it received: a close frame or not."""
    for length in range(min(len(last) - 2, 125), -1, -1):
        start = len(last) - length
        if last[start - 2] == 0x80 | OPCODE_CLOSE and last[start - 1] == length:
            return f"close frame {close_code(last, start, len(last))}"
    return "closed without close frame"


# --- the publisher process ---------------------------------------------------------------------


def publisher_main(
    ctrl: mpc.Connection, host: str, port: int, size: int, ack: bool, setup_timeout: float
) -> None:
    """Connect, report ready, publish on an absolute schedule when told to go."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()
    connect = masked(cbor2.dumps({"op": "connect", "version": 1, "client": "bench-publisher"}))
    setup = open_connections(
        host, port, range(1), lambda _i: connect, ready_marker=b"connected", timeout=setup_timeout
    )
    ctrl.send(("ready", len(setup.ready), dict(setup.failures), setup.seconds))
    if not setup.ready or not ctrl.poll(setup_timeout + 60):
        return
    msg = ctrl.recv()
    if msg[0] != "go":
        return
    _, rate, duration, drain = msg
    try:
        result = publish(setup.ready[0], size, ack, rate, duration, drain)
    finally:
        close_all(setup.ready)
    ctrl.send(("done", result))


def publish(
    conn: RawConn, size: int, ack: bool, rate: float, duration: float, drain: float
) -> dict:
    sock = conn.sock
    total = max(1, round(rate * duration))
    period_ns = 1e9 / rate
    padding = b"x" * (size - STAMP_END)
    ep = select.epoll()
    ep.register(sock.fileno(), select.EPOLLIN)
    out = bytearray()
    sent_at: dict[str, int] = {}
    acks: list[float] = []
    statuses: Counter[str] = Counter()
    pending = conn.buf
    late_max = 0
    late_sum = 0
    blocked_sends = 0
    hard_deadline = time.monotonic() + duration * 2 + 30
    t0 = time.monotonic_ns() + 1_000_000
    sent = 0

    def read_replies(timeout: float) -> None:
        nonlocal pending
        for _fd, _ev in ep.poll(timeout):
            try:
                data = sock.recv(RECV_SIZE)
            except BlockingIOError:
                continue
            if not data:
                statuses["connection closed"] += 1
                ep.unregister(sock.fileno())
                return
            now = time.monotonic_ns()
            data = pending + data
            frames, rest = walk_frames(data)
            pending = data[rest:]
            for opcode, start, end in frames:
                if opcode == OPCODE_CLOSE:
                    statuses[f"close frame {close_code(data, start, end)}"] += 1
                    continue
                reply = cbor2.loads(data[start:end])
                if reply.get("op") != "publish_status":
                    continue
                statuses[reply.get("status", "?")] += 1
                stamp = sent_at.pop(reply.get("closure", ""), None)
                if stamp is not None:
                    acks.append((now - stamp) / 1e6)

    while sent < total and time.monotonic() < hard_deadline:
        due = t0 + int(sent * period_ns)
        now = time.monotonic_ns()
        if now < due:
            read_replies((due - now) / 1e9)
            continue
        late = now - due
        late_sum += late
        late_max = max(late_max, late)
        op: dict[str, Any] = {
            "op": "publish",
            "subject": SUBJECT,
            "content": MARK + b"%019d" % time.monotonic_ns() + padding,
        }
        if ack:
            closure = str(sent)
            op["closure"] = closure
        out += masked(cbor2.dumps(op))
        if ack:
            sent_at[closure] = time.monotonic_ns()
        with contextlib.suppress(BlockingIOError):
            del out[: sock.send(out)]
        if out:
            blocked_sends += 1
            select.select([], [sock], [], 1.0)
        sent += 1
    finished = time.monotonic_ns()
    while out and time.monotonic() < hard_deadline:
        select.select([], [sock], [], 1.0)
        with contextlib.suppress(BlockingIOError):
            del out[: sock.send(out)]
    drain_deadline = time.monotonic() + drain
    while ack and sent_at and time.monotonic() < drain_deadline:
        read_replies(0.05)
    ep.close()
    acks.sort()

    def q(p: float) -> float:
        return acks[min(len(acks) - 1, int(p * len(acks)))] if acks else float("nan")

    return {
        "sent": sent,
        "seconds": (finished - t0) / 1e9,
        "late_max_ms": late_max / 1e6,
        "late_mean_ms": late_sum / max(sent, 1) / 1e6,
        "blocked_sends": blocked_sends,
        "statuses": dict(statuses),
        "acks": len(acks),
        "ack_ms": {
            "p50": q(0.5),
            "p90": q(0.9),
            "p99": q(0.99),
            "max": acks[-1] if acks else float("nan"),
        },
    }


# --- the parent ----------------------------------------------------------------------------------


def run(args: argparse.Namespace, server: ServerProcess, procs: list[mp.Process]) -> dict:
    ctx = mp.get_context("fork")
    lifetime = args.setup_timeout + args.duration * 2 + args.drain + 120
    sub_pipes = []
    for k, (first, count) in enumerate(split(args.subscribers, args.procs)):
        parent_end, child_end = ctx.Pipe()
        proc = ctx.Process(
            target=subscriber_main,
            args=(child_end, server.host, server.port, first, count, args.setup_timeout, lifetime),
            name=f"subscribers-{k}",
            daemon=True,
        )
        proc.start()
        child_end.close()
        procs.append(proc)
        sub_pipes.append(parent_end)
    pub_pipe, child_end = ctx.Pipe()
    pub = ctx.Process(
        target=publisher_main,
        args=(child_end, server.host, server.port, args.size, args.ack, args.setup_timeout),
        name="publisher",
        daemon=True,
    )
    pub.start()
    child_end.close()
    procs.append(pub)

    t_setup = time.monotonic()
    ready = receive(sub_pipes, "ready", args.setup_timeout + 30)
    (pub_ready,) = receive([pub_pipe], "ready", args.setup_timeout + 30)
    subscribed = sum(r[1] for r in ready)
    setup_failures: Counter[str] = Counter()
    for r in [*ready, pub_ready]:
        setup_failures.update(r[2])
    setup_seconds = time.monotonic() - t_setup
    print(
        f"setup: {subscribed}/{args.subscribers} subscribers confirmed SUBSCRIBE_ALLOW "
        f"in {setup_seconds:.1f} s; publisher {'ready' if pub_ready[1] else 'FAILED'}"
        + (f"; failures {dict(setup_failures)}" if setup_failures else ""),
        flush=True,
    )
    if not pub_ready[1]:
        raise RuntimeError(f"publisher could not connect: {pub_ready[2]}")

    pids = {"server": server.pid, "publisher": pub.pid or 0}
    pids.update({proc.name: proc.pid or 0 for proc in procs if proc is not pub})
    meter = CpuMeter(pids)
    figures: dict = {
        "subscribed": subscribed,
        "setup_failures": dict(setup_failures),
        "setup_seconds": setup_seconds,
        "rss_before": rss_kib(server.pid),
        "stats_before": server_stats(server.host, server.port) or {},
    }
    meter.start()
    pub_pipe.send(("go", args.rate, args.duration, args.drain))
    print(
        f"publishing {args.rate:g} msg/s x {args.size} B for {args.duration:g} s "
        f"to {subscribed} subscribers ...",
        flush=True,
    )
    (done,) = receive([pub_pipe], "done", args.duration * 2 + args.drain + 60)
    figures["cpu"] = meter.stop()
    figures["stats_after"] = server_stats(server.host, server.port) or {}
    figures["published"] = done[1]
    for pipe in sub_pipes:
        pipe.send(("finish", done[1]["sent"], args.drain))
    figures["results"] = [r[1] for r in receive(sub_pipes, "result", args.drain + 30)]
    figures["rss_after"] = rss_kib(server.pid)
    for proc in procs:
        proc.join(5)
    return summarise(args, figures)


def summarise(args: argparse.Namespace, figures: dict) -> dict:
    """Merge the load processes' histograms and counts into the figures we report."""
    published, results, cpu = figures["published"], figures["results"], figures["cpu"]
    subscribed = figures["subscribed"]
    hist = merge_hist([dense(r["hist"]) for r in results])
    received = sum(r["received"] for r in results)
    expected = published["sent"] * subscribed
    per_conn: Counter[int] = Counter()
    closes: Counter[str] = Counter()
    for r in results:
        per_conn.update({int(k): v for k, v in r["per_conn_counts"].items()})
        closes.update(r["closes"])
    short = sum(v for k, v in per_conn.items() if k < published["sent"])
    extra = sum(v for k, v in per_conn.items() if k > published["sent"])
    latency = percentiles_ms(hist, QUANTILES)
    latency["max"] = max(r["max_ns"] for r in results) / 1e6
    load_cpu = sum(v for k, v in cpu.items() if k.startswith(("subscribers", "publisher")))
    all_delivered = received == expected and short == 0 and subscribed == args.subscribers
    passed = all_delivered and latency["p99"] <= TARGET_P99_MS
    before, after = figures["stats_before"], figures["stats_after"]
    server_counters = {
        key: after[key] - before.get(key, 0)
        for key in ("writes", "bytes_written", "frames_fanned_out", "slow_consumers")
        if key in after
    }
    return {
        "benchmark": "fanout",
        "settings": args.set,
        "subscribers": args.subscribers,
        "subscribed": subscribed,
        "rate": args.rate,
        "size": args.size,
        "duration": args.duration,
        "procs": args.procs,
        "setup_seconds": figures["setup_seconds"],
        "setup_failures": figures["setup_failures"],
        "published": published,
        "deliveries_expected": expected,
        "deliveries_received": received,
        "deliveries_per_second": received / max(published["seconds"], 1e-9),
        "subscribers_short": short,
        "subscribers_extra": extra,
        "subscriber_counts_off": {
            str(k): v for k, v in sorted(per_conn.items()) if k != published["sent"]
        },
        "closes": dict(closes),
        "latency_ms": latency,
        "cpu_percent": cpu,
        "load_generator_cpu_percent": load_cpu,
        "subscriber_recvs": sum(r["recvs"] for r in results),
        "subscriber_polls": sum(r["polls"] for r in results),
        "server_rss_kib": {"before": figures["rss_before"], "after": figures["rss_after"]},
        "server_counters": server_counters,
        "all_delivered": all_delivered,
        "pass": passed,
    }


def report(result: dict) -> None:
    lat = result["latency_ms"]
    pub = result["published"]
    cpu = result["cpu_percent"]
    print()
    print(f"settings             : {' '.join(result['settings']) or '(defaults)'}")
    print(
        f"published            : {pub['sent']} in {pub['seconds']:.2f} s "
        f"(schedule lateness mean {pub['late_mean_ms']:.2f} ms, max {pub['late_max_ms']:.2f} ms)"
    )
    print(
        f"deliveries           : {result['deliveries_received']} / "
        f"{result['deliveries_expected']} expected "
        f"({result['deliveries_per_second']:,.0f}/s); "
        f"{result['subscribers_short']} subscribers short, {result['subscribers_extra']} over"
    )
    print("latency ms           : " + ", ".join(f"{k} {v:.1f}" for k, v in lat.items()))
    if pub["acks"]:
        ack = pub["ack_ms"]
        print(
            f"publish ack ms       : p50 {ack['p50']:.1f}, p90 {ack['p90']:.1f}, "
            f"p99 {ack['p99']:.1f}, max {ack['max']:.1f} ({pub['acks']} acks)"
        )
    print(f"publish statuses     : {pub['statuses']}")
    print(
        f"server CPU           : {cpu['server']:.0f} %  (RSS {result['server_rss_kib']['before']}"
        f" -> {result['server_rss_kib']['after']} KiB)"
    )
    print(
        f"load generator CPU   : {result['load_generator_cpu_percent']:.0f} % "
        + "("
        + ", ".join(
            f"{k} {v:.0f}" for k, v in cpu.items() if k.startswith(("subscribers", "publisher"))
        )
        + ")"
    )
    counters = result["server_counters"]
    if counters.get("writes"):
        print(
            f"server writes        : {counters['writes'] / cpu['wall_seconds']:,.0f}/s, "
            f"{counters.get('frames_fanned_out', 0) / counters['writes']:.1f} deliveries per "
            f"write; slow consumers cut off: {counters.get('slow_consumers', 0)}"
        )
    print(
        f"machine CPU          : {cpu['machine']:.0f} % of {100 * mp.cpu_count()} % "
        f"(softirq {cpu['softirq']:.0f} %, other processes {cpu['other']:.0f} %)"
    )
    if result["closes"] or result["setup_failures"]:
        print(f"closes / failures    : {result['closes']} {result['setup_failures']}")
    server = result.get("server_log", {})
    if server:
        print(f"server log           : {server['counts'] or 'no warnings'} ({server['log']})")
        for line in server["examples"][:5]:
            print(f"    {line}")
    verdict = "PASS" if result["pass"] else "FAIL"
    print(
        f"result               : {verdict} (all delivered: {result['all_delivered']}, "
        f"p99 {lat['p99']:.1f} ms vs {TARGET_P99_MS:g} ms)"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subscribers", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=100.0, help="messages per second")
    parser.add_argument("--size", type=int, default=100, help="content bytes (>= 24)")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of publishing")
    parser.add_argument("--procs", type=int, default=2, help="subscriber processes")
    parser.add_argument(
        "--drain",
        type=float,
        default=5.0,
        help="seconds to wait for stragglers after the last publish",
    )
    parser.add_argument("--setup-timeout", type=float, default=60.0)
    parser.add_argument(
        "--no-ack",
        dest="ack",
        action="store_false",
        help="publish without closures (no PUBLISH_OK, no ack latency)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="Key=Value",
        help="server setting, passed through to `migratory serve --set`",
    )
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON")
    parser.add_argument(
        "--self-test", action="store_true", help="check the stamp scanner offline, then exit"
    )
    args = parser.parse_args(argv)
    if args.size < STAMP_END + 1:
        parser.error(f"--size must be at least {STAMP_END + 1}")
    if args.subscribers < 1 or args.procs < 1 or args.rate <= 0 or args.duration <= 0:
        parser.error("--subscribers, --procs, --rate and --duration must be positive")
    args.procs = min(args.procs, args.subscribers)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.self_test:
        self_test()
        return 0
    raise_nofile()
    return run_with_server(
        "fanout", args.set, lambda server, procs: run(args, server, procs), report, args.json
    )


if __name__ == "__main__":
    sys.exit(main())
