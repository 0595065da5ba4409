"""The idle-connections pattern: how much server memory one open WebSocket session costs.

``--connections`` WebSocket sessions (HTTP handshake, native ``connect`` ->
``connected``) opened from ``--procs`` load processes (raw non-blocking sockets
and epoll, at most ``--window`` handshakes in flight per process), then held
idle. The server's VmRSS (/proc/PID/status; its process is found by the port it
listens on, or named with ``--pid``) is read before, once connected, after the
hold (the figure per connection), after one native ``ping`` on every connection
(the ``pong`` answers prove the server still serves each session) and after
they closed. ``/stats`` gives the server's own count of open connections. With
``--heartbeat MS`` each ``connect`` asks for heartbeats (docs/protocol.md), as the SDKs
do: the hold then counts them and the server's CPU while it sends them.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import multiprocessing.connection as mpc
import select
import signal
import sys
import time
from collections import Counter
from multiprocessing.process import BaseProcess
from typing import Any

import cbor2

from migratory.bench.loadgen import receive, split
from migratory.bench.procfs import CpuMeter, die_with_parent, raise_nofile, rss_kib
from migratory.bench.progress import Progress, wait_for_all
from migratory.bench.target import Target
from migratory.bench.workers import all_workers_stats, worker_pids
from migratory.bench.wsraw import (
    OPCODE_CLOSE,
    RECV_SIZE,
    RawConn,
    close_all,
    close_code,
    masked,
    open_connections,
    walk_frames,
)

TARGET_KIB_PER_CONNECTION = 16.0
HEARTBEAT = cbor2.dumps({"op": "pong"})  # a pong without id
SETTLE_SECONDS = 1.0


# --- load processes -----------------------------------------------------------------------


def holder_main(
    ctrl: mpc.Connection,
    host: str,
    port: int,
    first: int,
    count: int,
    window: int,
    setup_timeout: float,
    lifetime: float,
    heartbeat_ms: int | None = None,
) -> None:
    """Open ``count`` sessions, then obey the parent: hold, ping, close."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    die_with_parent()
    raise_nofile()
    hard_deadline = time.monotonic() + lifetime

    def frames_for(index: int) -> bytes:
        connect: dict[str, Any] = {"op": "connect", "version": 1, "client": f"bench-{index}"}
        if heartbeat_ms is not None:
            connect["heartbeat"] = heartbeat_ms
        return masked(cbor2.dumps(connect))

    setup = open_connections(
        host,
        port,
        range(first, first + count),
        frames_for,
        ready_marker=b"connected",
        timeout=setup_timeout,
        window=window,
    )
    conns = setup.ready
    ctrl.send(("ready", len(conns), dict(setup.failures), setup.seconds, setup.connect_ms_max))
    try:
        while time.monotonic() < hard_deadline:
            if not ctrl.poll(min(60.0, max(hard_deadline - time.monotonic(), 0.0))):
                continue
            command = ctrl.recv()
            if command[0] == "hold":
                ctrl.send(("held", watch(conns, command[1], None)))
            elif command[0] == "ping":
                ping = masked(cbor2.dumps({"op": "ping", "id": 1}))
                ctrl.send(("pinged", watch(conns, command[1], ping)))
            else:
                break
    finally:
        close_all(conns)


def watch(conns: list[RawConn], seconds: float, ping: bytes | None) -> dict[str, Any]:
    """Watch the open connections for ``seconds``; with ``ping``, send it and count pongs.

    Returns how many are still open, how they ended, and what frames arrived.
    With ``ping`` the watch ends early once every open connection answered.
    """
    t0 = time.monotonic()
    deadline = t0 + seconds
    ep = select.epoll()
    by_fd: dict[int, RawConn] = {}
    frames: Counter[str] = Counter()
    closes: Counter[str] = Counter()
    answered: set[int] = set()
    send_errors = 0
    for conn in conns:
        if conn.closed:
            continue
        fd = conn.sock.fileno()
        by_fd[fd] = conn
        ep.register(fd, select.EPOLLIN)
        if ping is not None:
            try:
                conn.sock.send(ping)
            except OSError:
                send_errors += 1
    try:
        while time.monotonic() < deadline:
            if ping is not None and len(answered) >= len(by_fd):
                break
            for fd, _ev in ep.poll(min(0.2, max(deadline - time.monotonic(), 0.0))):
                found = by_fd.get(fd)
                if found is None:
                    continue
                conn = found
                try:
                    data = conn.sock.recv(RECV_SIZE)
                except BlockingIOError:
                    continue
                except OSError as exc:
                    data = b""
                    conn.closed = f"recv error: {exc.strerror}"
                if not data:
                    conn.closed = conn.closed or "closed without close frame"
                    closes[conn.closed] += 1
                    ep.unregister(fd)
                    del by_fd[fd]
                    answered.discard(fd)
                    continue
                data = conn.buf + data
                parts, rest = walk_frames(data)
                conn.buf = data[rest:]
                for opcode, start, end in parts:
                    if opcode == OPCODE_CLOSE:
                        conn.closed = f"close frame {close_code(data, start, end)}"
                        frames["close"] += 1
                    elif data[start:end] == HEARTBEAT:
                        frames["heartbeat"] += 1
                    elif data.find(b"pong", start, end) >= 0:
                        frames["pong"] += 1
                        answered.add(fd)
                    else:
                        frames["other"] += 1
    finally:
        ep.close()
    return {
        "open": len(by_fd),
        "answered": len(answered),
        "closes": dict(closes),
        "frames": dict(frames),
        "send_errors": send_errors,
        "seconds": time.monotonic() - t0,
    }


# --- the parent ----------------------------------------------------------------------------


def broadcast(
    pipes: list[mpc.Connection],
    command: tuple[Any, ...],
    kind: str,
    timeout: float,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Send ``command`` to every load process and add up their ``kind`` answers."""
    for pipe in pipes:
        pipe.send(command)
    if progress is not None:
        wait_for_all(pipes, progress, timeout)
    total: dict[str, Any] = {"open": 0, "answered": 0, "send_errors": 0, "seconds": 0.0}
    closes: Counter[str] = Counter()
    frames: Counter[str] = Counter()
    for _, part in receive(pipes, kind, timeout):
        for key in ("open", "answered", "send_errors"):
            total[key] += part[key]
        total["seconds"] = max(total["seconds"], part["seconds"])
        closes.update(part["closes"])
        frames.update(part["frames"])
    total["closes"] = dict(closes)
    total["frames"] = dict(frames)
    return total


def run(args: argparse.Namespace, target: Target, procs: list[BaseProcess]) -> dict[str, Any]:
    ctx = mp.get_context("fork")
    lifetime = args.setup_timeout + args.hold + args.ping_timeout + 300
    time.sleep(SETTLE_SECONDS)
    # the server's processes: one, or a supervisor and its workers (docs/workers.md)
    servers = {"server": target.pid, **worker_pids(target.pid)} if target.pid else {}
    workers = max(1, len(servers) - 1)

    def rss() -> int:
        return sum(rss_kib(pid) for pid in servers.values())

    def stats() -> dict[str, Any]:
        return (all_workers_stats(target.host, target.port, workers) if target.stats
                else None) or {}

    rss_start = rss()
    pipes = []
    meter = CpuMeter(dict(servers))
    meter.start()
    t0 = time.monotonic()
    for k, (first, count) in enumerate(split(args.connections, args.procs)):
        parent_end, child_end = ctx.Pipe()
        proc = ctx.Process(
            target=holder_main,
            args=(
                child_end,
                target.host,
                target.port,
                first,
                count,
                args.window,
                args.setup_timeout,
                lifetime,
                args.heartbeat,
            ),
            name=f"holders-{k}",
            daemon=True,
        )
        proc.start()
        child_end.close()
        procs.append(proc)
        pipes.append(parent_end)
    for holder in procs:
        meter.add(holder.name, holder.pid or 0, since_birth=True)
    ready = receive(pipes, "ready", args.setup_timeout + 30)
    setup_seconds = time.monotonic() - t0
    setup_cpu = meter.stop()
    opened = sum(r[1] for r in ready)
    failures: Counter[str] = Counter()
    for r in ready:
        failures.update(r[2])
    rss_connected = rss()
    print(
        f"setup: {opened}/{args.connections} sessions connected in {setup_seconds:.1f} s "
        f"({opened / max(setup_seconds, 1e-9):,.0f}/s, slowest {max(r[4] for r in ready):.0f} ms)"
        + (f"; failures {dict(failures)}" if failures else ""),
        file=sys.stderr,
        flush=True,
    )
    print(f"holding {args.hold:g} s ...", file=sys.stderr, flush=True)
    progress = Progress(args.hold, f"{target.name}: {opened:,} idle sessions",
                        enabled=None if args.progress else False)
    hold_meter = CpuMeter(dict(servers))  # (the heartbeats' cost, with --heartbeat)
    hold_meter.start()
    held = broadcast(pipes, ("hold", args.hold), "held", args.hold + 60, progress)
    hold_cpu = hold_meter.stop()
    rss_held = rss()
    stats_held = stats()
    pinged = broadcast(pipes, ("ping", args.ping_timeout), "pinged", args.ping_timeout + 60)
    rss_pinged = rss()
    for pipe in pipes:
        pipe.send(("close",))
    for holder in procs:
        holder.join(10)
    time.sleep(SETTLE_SECONDS)
    rss_closed = rss()
    stats_closed = stats()

    per_conn = (rss_held - rss_start) / max(opened, 1) if target.pid else None
    all_open = opened == args.connections and held["open"] == opened
    all_answered = pinged["answered"] == args.connections
    return {
        "benchmark": "idle_connections",
        "pattern": "idle-connections",
        "kib_per_connection": per_conn,
        "counted": pinged["answered"],  # sessions that answered the ping after the hold
        "expected": args.connections,
        "latency_ms": {},
        "hist": {},
        "cpu_percent": {k: v for k, v in setup_cpu.items() if k.startswith("server")},
        "settings": args.set,
        "connections": args.connections,
        "procs": args.procs,
        "opened": opened,
        "setup_failures": dict(failures),
        "setup_seconds": setup_seconds,
        "setup_rate_per_second": opened / max(setup_seconds, 1e-9),
        "setup_slowest_ms": max(r[4] for r in ready),
        "setup_cpu_percent": setup_cpu,
        "heartbeat_ms": args.heartbeat,
        "hold_cpu_percent": hold_cpu,
        "held": held,
        "pinged": pinged,
        "server_rss_kib": {
            "start": rss_start,
            "connected": rss_connected,
            "held": rss_held,
            "pinged": rss_pinged,
            "closed": rss_closed,
        },
        "rss_kib_per_connection": per_conn,
        "server_open_connections": {
            "held": stats_held.get("connections_open"),
            "closed": stats_closed.get("connections_open"),
        },
        "all_open": all_open,
        "all_answered": all_answered,
        "all_delivered": all_open and all_answered,
        "pass": all_open and all_answered and (
            per_conn is None or per_conn <= TARGET_KIB_PER_CONNECTION
        ),
    }


def report(result: dict[str, Any]) -> None:
    rss = result["server_rss_kib"]
    held = result["held"]
    pinged = result["pinged"]
    cpu = result["setup_cpu_percent"]
    load_cpu = sum(v for k, v in cpu.items() if k.startswith("holders"))
    server_cpu = sum(v for k, v in cpu.items() if k.startswith("server"))
    print()
    print(f"settings             : {' '.join(result['settings']) or '(defaults)'}")
    print(
        f"sessions             : {result['opened']} / {result['connections']} connected in "
        f"{result['setup_seconds']:.1f} s ({result['setup_rate_per_second']:,.0f}/s; server CPU "
        f"{server_cpu:.0f} %, load generator {load_cpu:.0f} %)"
    )
    hold_cpu = sum(v for k, v in result["hold_cpu_percent"].items() if k.startswith("server"))
    print(
        f"after {held['seconds']:.1f} s hold    : {held['open']} open; "
        f"closes {held['closes'] or 0}; frames {held['frames'] or 0}; server CPU "
        f"{hold_cpu:.1f} % (heartbeat asked: {result['heartbeat_ms'] or 'none'})"
    )
    print(
        f"ping -> pong         : {pinged['answered']} answered in {pinged['seconds']:.2f} s "
        f"(frames {pinged['frames']}, closes {pinged['closes'] or 0})"
    )
    print(
        f"server RSS KiB       : start {rss['start']}, connected {rss['connected']}, "
        f"held {rss['held']}, after pings {rss['pinged']}, after close {rss['closed']}"
    )
    open_conns = result["server_open_connections"]
    print(
        f"server says open     : {open_conns['held']} while held, "
        f"{open_conns['closed']} after the clients closed (incl. the /stats request itself)"
    )
    per_conn = result["rss_kib_per_connection"]
    print(
        "RSS per connection   : "
        + ("not measured (no server process here)" if per_conn is None else f"{per_conn:.2f} KiB")
        + f" (target <= {TARGET_KIB_PER_CONNECTION:g} KiB)"
    )
    if result["setup_failures"]:
        print(f"setup failures       : {result['setup_failures']}")
    server = result.get("server_log", {})
    if server:
        print(f"server log           : {server['counts'] or 'no warnings'} ({server['log']})")
        for line in server["examples"][:5]:
            print(f"    {line}")
    print(
        f"result               : {'PASS' if result['pass'] else 'FAIL'} "
        f"(all open: {result['all_open']}, all answered: {result['all_answered']})"
    )



