#!/usr/bin/env python3
"""What one idle-write sweep over N subscribers costs per connection, and how much is ours.

Three measurements of one message written to N (1,000) connections, in this process:

- ``python``: the server's own Python around the writes -- ``Session.deliver`` for each
  subscriber (the fan-out into outboxes) and ``Server.write_urgent`` (the sweep) over real
  ``Connection`` objects whose socket's ``send`` takes everything and does nothing;
- ``write_urgent``: the same sweep over N loopback TCP sockets, drained by two reader
  processes with one epoll each (like the bench's subscribers);
- ``bare send``: ``for sock in socks: sock.send(frame)`` over the same sockets -- what
  any single-threaded server pays the kernel; with ``--threads K`` also the bare loop
  split over K threads (``socket.send`` releases the GIL).

Trio-thread CPU (``time.thread_time``; the process's for the threads) and wall time per
connection, medians over the rounds. The readers share the machine's cores, as the
subscribers of ``benchmarks/fanout.py`` do, so the wall time includes being preempted
by them.

    .venv/bin/python benchmarks/send_sweep_cpu.py [--connections 1000] [--rounds 30]
        [--threads 2]
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import select
import socket
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from migratory.config import load_config
from migratory.listeners import OPEN_LISTENER
from migratory.server.app import Server
from migratory.server.connection import Connection
from migratory.server.session import Session

FRAME = b"\x82\x7e\x00\x96" + b"x" * 150  # a 150-byte binary frame, as a delivery is
READER_LIFETIME = 300.0


def _reader(port: int, count: int, stop: mp.synchronize.Event) -> None:
    """Connect ``count`` sockets and read whatever comes until told to stop."""
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(count)]
    poller = select.epoll()
    by_fd = {}
    for sock in socks:
        sock.setblocking(False)
        poller.register(sock.fileno(), select.EPOLLIN)
        by_fd[sock.fileno()] = sock
    deadline = time.monotonic() + READER_LIFETIME
    while not stop.is_set() and time.monotonic() < deadline:
        for fd, _event in poller.poll(0.05):
            with contextlib.suppress(BlockingIOError):
                by_fd[fd].recv(65536)


class _NullSocket:
    def send(self, data: bytes) -> int:
        return len(data)


def _connections(server: Server, socks: Sequence[Any]) -> list[Connection]:
    return [Connection(server, sock, "127.0.0.1:1", OPEN_LISTENER) for sock in socks]


def _deliver(connections: list[Connection]) -> None:
    for connection in connections:
        session = connection.session
        assert isinstance(session, Session)
        session.deliver(FRAME)


def _per_connection(samples: list[tuple[int, int]], count: int) -> str:
    cpu = statistics.median(s[0] for s in samples) / count / 1000
    wall = statistics.median(s[1] for s in samples) / count / 1000
    return f"CPU {cpu:5.2f} us, wall {wall:5.2f} us per connection"


def _timed(
    run: Callable[[], object], clock: Callable[[], int] = time.thread_time_ns
) -> tuple[int, int]:
    cpu, wall = clock(), time.perf_counter_ns()
    run()
    return clock() - cpu, time.perf_counter_ns() - wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--threads", type=int, default=0, help="also a bare loop over K threads")
    options = parser.parse_args()
    count = options.connections
    server = Server(load_config(overrides={"Listen": "127.0.0.1:0"}, environ={}))

    fake = _connections(server, [_NullSocket() for _ in range(count)])
    fan_out: list[tuple[int, int]] = []
    sweep: list[tuple[int, int]] = []
    for _ in range(max(options.rounds, 100)):
        fan_out.append(_timed(lambda: _deliver(fake)))
        sweep.append(_timed(server.write_urgent))
        server.written.clear()
    print(f"python  fan-out ({count} x Session.deliver): {_per_connection(fan_out, count)}")
    print(f"python  sweep (Server.write_urgent, null send): {_per_connection(sweep, count)}")

    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen(4096)
    stop = mp.Event()
    readers = [
        mp.Process(target=_reader, args=(listening.getsockname()[1], share, stop), daemon=True)
        for share in (count // 2, count - count // 2)
    ]
    for reader in readers:
        reader.start()
    socks: list[socket.socket] = []
    while len(socks) < count:
        sock, _address = listening.accept()
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        socks.append(sock)
    real = _connections(server, socks)
    pool = ThreadPoolExecutor(options.threads) if options.threads > 1 else None
    results: dict[str, list[tuple[int, int]]] = {"write_urgent": [], "bare send": []}

    def bare(part: list[socket.socket]) -> None:
        for sock in part:
            sock.send(FRAME)

    def threaded() -> None:
        assert pool is not None
        size = -(-count // options.threads)
        parts = [socks[i : i + size] for i in range(0, count, size)]
        for future in [pool.submit(bare, part) for part in parts]:
            future.result()

    time.sleep(0.5)
    try:
        for _ in range(options.rounds):
            _deliver(real)
            results["write_urgent"].append(_timed(server.write_urgent))
            server.written.clear()
            time.sleep(0.05)
            results["bare send"].append(_timed(lambda: bare(socks)))
            time.sleep(0.05)
            if pool is not None:
                key = f"bare send, {options.threads} threads"
                results.setdefault(key, []).append(_timed(threaded, time.process_time_ns))
                time.sleep(0.05)
    finally:
        stop.set()
        for reader in readers:
            reader.join(5)
    for name, samples in results.items():
        print(f"sockets {name}: {_per_connection(samples, count)}")


if __name__ == "__main__":
    main()
