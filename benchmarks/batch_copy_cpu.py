#!/usr/bin/env python3
"""What joining a batch costs against writing it: ``b"".join`` + ``send`` (what
``Outbox.take`` and ``Connection._write`` do) against ``sendmsg`` of the frames as they
are (no copy in user space: what a backlog of shared runs would write), per write.

Two batch shapes, written to ``--connections`` loopback TCP sockets drained by a reader
process with one epoll (as the bench's subscribers):

- ``small``: k frames of 150 bytes (k = 1, 2, 6, 43), a one-subject fan-out's batch
  (issue 13: 100-byte messages, 4-43 deliveries per write);
- ``runs``: four shared runs of 16 KiB (``format_sink.RUN_BYTES``), a 64 KiB batch of a
  cache sync's jump of 1 kB messages (``Hub.reposition``), and the join alone.

The sender thread's CPU (``time.thread_time``) per write, median over ``--rounds``;
the two ways alternate within a round, so a busy box's load falls on both::

    .venv/bin/python benchmarks/batch_copy_cpu.py [small|runs] [--connections 200]
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import socket
import statistics
import time
from collections.abc import Callable

from send_sweep_cpu import _reader  # (benchmarks/ is this script's sys.path[0])


def _per_write(write: Callable[[socket.socket], object], conns: list[socket.socket]) -> float:
    started = time.thread_time()
    for conn in conns:
        with contextlib.suppress(BlockingIOError):
            write(conn)
    return (time.thread_time() - started) / len(conns)


def _compare(conns: list[socket.socket], frames: list[bytes], rounds: int,
             pause: float) -> dict[str, float]:
    """Median µs per write: joined and sent, sent with ``sendmsg``, joined alone, and the
    loop alone (the harness's own cost per socket, in all the others)."""
    ways: dict[str, Callable[[socket.socket], object]] = {
        "join+send": lambda conn: conn.send(b"".join(frames)),
        "sendmsg": lambda conn: conn.sendmsg(frames),
    }
    samples: dict[str, list[float]] = {name: [] for name in (*ways, "join alone", "loop")}
    for _ in range(rounds):
        for name, write in ways.items():
            samples[name].append(_per_write(write, conns))
            time.sleep(pause)  # the reader drains before the next way writes
        samples["join alone"].append(_per_write(lambda conn: b"".join(frames), conns))
        samples["loop"].append(_per_write(lambda conn: None, conns))
    return {name: round(statistics.median(values) * 1e6, 2) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shape", choices=("small", "runs"), nargs="?", default="runs")
    parser.add_argument("--connections", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(args.connections)
    stop = mp.Event()
    reader = mp.Process(target=_reader,
                        args=(listener.getsockname()[1], args.connections, stop), daemon=True)
    reader.start()
    try:
        conns = [listener.accept()[0] for _ in range(args.connections)]
        for conn in conns:
            conn.setblocking(False)
        if args.shape == "runs":
            runs = [bytes([65 + n]) * 16384 for n in range(4)]
            print("4 runs of 16 KiB (us per write):", _compare(conns, runs, args.rounds, 0.2))
        else:
            for count in (1, 2, 6, 43):
                frames = [bytes([65 + n % 26]) * 150 for n in range(count)]
                print(f"{count} frames of 150 B (us per write):",
                      _compare(conns, frames, args.rounds, 0.05))
    finally:
        stop.set()
        reader.join(10)
        listener.close()


if __name__ == "__main__":
    main()
