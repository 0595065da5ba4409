#!/usr/bin/env python3
"""Sends off the event loop's thread: plain ``send`` against io_uring SQPOLL (issue 13).

For N loopback TCP connections (default 10,000, then 1,000) drained by reader processes
(one epoll each, counting every byte per connection), the sending thread delivers a
150-byte frame per send in two shapes:

- ``paced``: ``--rate`` sends/s (40,000) round-robin over the connections for
  ``--duration`` s, due sends written every ~1 ms pass -- the many-subjects shape, where
  every delivery is its own ``send``;
- ``sweep``: ``--rounds`` rounds ``--interval`` s apart, one send to every connection
  per round -- the one-subject floor's shape, each send waking a sleeping reader.

and five ways:

- ``send``: ``sock.send(frame)`` on non-blocking sockets, what the server does today; a
  partial send or ``EAGAIN`` keeps the rest in an outbox retried each pass (counted);
- ``sqpoll``: io_uring with ``IORING_SETUP_SQPOLL`` (``benchmarks/uring_ring.py``,
  ctypes, no liburing): the thread writes ``IORING_OP_SEND`` SQEs and bumps the tail once
  per pass; the kernel's ``iou-sqp`` thread does the sends; completions are reaped once
  per pass. At most one send in flight per connection (frames due meanwhile are queued
  and sent as one buffer after its CQE); buffers are referenced until their CQE; a short
  completion is resubmitted for the rest, a ``-EAGAIN`` resubmitted, both counted;
- ``uring``: the same without SQPOLL, one ``io_uring_enter`` per pass (the sends run
  inside it, on the sending thread);
- ``async``: ``uring`` with every SEND SQE flagged ``IOSQE_ASYNC``: the kernel hands
  each send to its io-wq worker threads (``iou-wrk-*``, threads of this process that
  sleep when idle) instead of doing it inside ``io_uring_enter``; ``--iowq-workers N``
  caps them (``IORING_REGISTER_IOWQ_MAX_WORKERS``; sends go to the unbounded pool),
  ``--async-submit-ms T`` submits only every T ms (bigger batches per enter);
- ``sqpoll-lazy``: ``sqpoll`` with the tail published only every ``--lazy-submit-ms``
  (5) and ``sq_thread_idle`` ``--lazy-idle-ms`` (1), so the SQ thread can sleep between
  submissions (woken with ``IORING_ENTER_SQ_WAKEUP`` when it set ``NEED_WAKEUP``); the
  loop's passes stay ~1 ms, a send waits up to the submit interval before it goes out.

Reported per delivery (``benchmarks/uring_meter.py``): the sending thread's CPU
(``time.thread_time``), the process's (``time.process_time``: every task of the thread
group, the ``iou-sqp`` and ``iou-wrk`` threads included), the difference being the
kernel threads' ("other"), split by name from each task's ``schedstat``: ``iou-sqp``,
``iou-wrk`` and "exited" (threads gone by the end of the run -- io-wq workers retire
after ~5 s idle -- process - thread - live others), the ring's own ``SqWorkTime`` /
``SqTotalTime`` (fdinfo: the time it did work / was awake, polling included), the
readers', the machine's CPU (``/proc/stat``, % of one core, 200 % here) and this
benchmark's own share (process + readers, per second of run: other load on a shared
machine does not inflate it); for the sweep also the time from the round's start until
the last reader had its frame. Every run checks that every connection received
exactly the bytes sent.

    .venv/bin/python benchmarks/uring_send_cpu.py [--connections 10000 1000]
        [--rate 40000] [--duration 4] [--rounds 15] [--interval 0.25]
        [--methods send sqpoll uring async sqpoll-lazy] [--shapes paced sweep]
        [--sq-idle-ms 10] [--sq-cpu K] [--iowq-workers 0] [--lazy-submit-ms 5]
        [--async-submit-ms 0]
        [--lazy-idle-ms 1] [--work-us 0] [--json out.json]

``--work-us W`` adds W us of other Python work per delivery on the sending thread (a
stand-in for the rest of the server's per-message cost) to see whether the rate holds;
its own CPU is measured ("stand-in") and the iterations per us corrected from it as
the run goes (a rate calibrated once, before the run, burned 13.5-18.4 us instead of 19
on this shared machine).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import select
import socket
import statistics
import sys
import time
from collections import Counter
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from uring_meter import Meter
from uring_ring import IOSQE_ASYNC, Ring, RingError, UringSender

FRAME = b"\x82\x7e\x00\x96" + b"x" * 150  # a 154-byte binary WebSocket frame
TICK = 0.001  # the sending loop's pass, as an event loop's
READER_LIFETIME = 600.0
CHECK_TIMEOUT = 15.0
DRAIN_TIMEOUT = 10.0


def _reader(port: int, count: int, control: Connection) -> None:
    """Connect ``count`` sockets, count the bytes each receives, answer the parent."""
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(count)]
    poller = select.epoll()
    by_fd, port_of, got = {}, {}, {}
    for sock in socks:
        sock.setblocking(False)
        poller.register(sock.fileno(), select.EPOLLIN)
        by_fd[sock.fileno()] = sock
        port_of[sock.fileno()] = sock.getsockname()[1]
        got[sock.fileno()] = 0
    poller.register(control.fileno(), select.EPOLLIN)
    control.send(("ready", [sock.getsockname()[1] for sock in socks]))
    buffer = bytearray(1 << 16)
    total, closed = 0, 0
    marks: list[int] = []
    mark_times: list[float] = []
    check: tuple[dict[int, int], int, float] | None = None
    deadline = time.monotonic() + READER_LIFETIME
    while time.monotonic() < deadline:
        for fd, _event in poller.poll(0.2):
            if fd == control.fileno():
                command = control.recv()
                if command[0] == "stop":
                    return
                if command[0] == "marks":
                    marks, mark_times = command[1], []
                elif command[0] == "check":
                    by_port = command[1]
                    want = {f: by_port[p] for f, p in port_of.items()}
                    check = (want, sum(want.values()), time.monotonic() + CHECK_TIMEOUT)
                continue
            try:
                size = by_fd[fd].recv_into(buffer)
            except BlockingIOError:
                continue
            if size == 0:
                poller.unregister(fd)
                closed += 1
                continue
            got[fd] += size
            total += size
            while len(mark_times) < len(marks) and total >= marks[len(mark_times)]:
                mark_times.append(time.monotonic())
        if check is not None and (total >= check[1] or time.monotonic() > check[2]):
            want = check[0]
            wrong = [(port_of[f], got[f], want[f]) for f in want if got[f] != want[f]]
            control.send(("checked", total, len(wrong), wrong[:5], mark_times, closed))
            check = None


def _burn(iterations: int) -> int:
    """Stand-in for the server's other per-message work (decode, hub, acknowledgement).
    The same cost per iteration whatever ``iterations``: ``total`` stays a one-digit int
    (a running sum outgrew 2**30 in the 2,000,000-iteration calibration and not in a
    pass's few thousand, so a pass burned ~15.4 us per "19 us" delivery)."""
    total = 0
    for i in range(iterations):
        total ^= i
    return total


def _iterations_per_us() -> float:
    start = time.thread_time()
    _burn(2_000_000)
    return 2_000_000 / ((time.thread_time() - start) * 1e6)


class PlainSender:
    """``sock.send`` on non-blocking sockets; the rest of a short send waits in an outbox."""

    name = "send"

    def __init__(self, socks: list[socket.socket]) -> None:
        self.socks = socks
        self.outbox: dict[int, bytes] = {}
        self.counts: Counter[str] = Counter()

    def send(self, index: int) -> None:
        if index in self.outbox:
            self.outbox[index] += FRAME
            self.counts["queued"] += 1
            return
        self._write(index, FRAME)

    def _write(self, index: int, data: bytes) -> None:
        try:
            size = self.socks[index].send(data)
        except BlockingIOError:
            size = 0
            self.counts["eagain"] += 1
        if size < len(data):
            self.outbox[index] = data[size:]
            self.counts["partial" if size else "blocked"] += 1
        else:
            self.outbox.pop(index, None)

    def flush(self, force: bool = False) -> None:
        for index, rest in list(self.outbox.items()):
            self._write(index, rest)

    def idle(self) -> bool:
        self.flush()
        return not self.outbox

    def close(self) -> dict[str, Any]:
        return dict(self.counts)


class Harness:
    """N accepted connections, their readers, and what each connection was sent."""

    def __init__(self, count: int, readers: int) -> None:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(4096)
        port = listener.getsockname()[1]
        shares = [count // readers + (i < count % readers) for i in range(readers)]
        self.controls: list[Connection] = []
        self.processes: list[mp.Process] = []
        for share in shares:
            mine, theirs = mp.Pipe()
            process = mp.Process(target=_reader, args=(port, share, theirs), daemon=True)
            process.start()
            self.controls.append(mine)
            self.processes.append(process)
        self.socks: list[socket.socket] = []
        listener.settimeout(60)
        while len(self.socks) < count:
            sock, _address = listener.accept()
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.socks.append(sock)
        listener.close()
        index_of = {sock.getpeername()[1]: i for i, sock in enumerate(self.socks)}
        self.ports: list[list[int]] = []
        for control in self.controls:
            if not control.poll(60):
                raise TimeoutError("a reader did not connect")
            self.ports.append(control.recv()[1])
        self.indexes = [[index_of[p] for p in ports] for ports in self.ports]
        self.sent = [0] * count  # bytes each connection was sent, cumulative

    def close(self) -> None:
        for control in self.controls:
            control.send(("stop",))
        for process in self.processes:
            process.join(5)
            if process.is_alive():
                process.kill()  # by PID: only the readers this script started
                process.join(5)
        for sock in self.socks:
            sock.close()

    def sender(self, method: str, options: argparse.Namespace) -> PlainSender | UringSender:
        if method == "send":
            return PlainSender(self.socks)
        entries = 1 << max(len(self.socks) - 1, 1).bit_length()
        lazy = method == "sqpoll-lazy"
        ring = Ring(
            min(entries, 32768), min(2 * entries, 65536), sqpoll=method.startswith("sqpoll"),
            sq_idle_ms=options.lazy_idle_ms if lazy else options.sq_idle_ms,
            sq_cpu=options.sq_cpu, sqe_flags=IOSQE_ASYNC if method == "async" else 0,
        )  # fmt: skip
        if method == "async" and options.iowq_workers:
            ring.max_workers(options.iowq_workers, options.iowq_workers)
        every_ms = {"sqpoll-lazy": options.lazy_submit_ms, "async": options.async_submit_ms}
        submit_every = every_ms.get(method, 0.0) / 1e3
        return UringSender(self.socks, ring, FRAME, name=method, submit_every=submit_every)

    def check(self) -> tuple[bool, list[Any]]:
        """Wait until every reader has every byte sent (or the timeout); the mark times."""
        for control, ports, indexes in zip(self.controls, self.ports, self.indexes, strict=True):
            control.send(("check", {p: self.sent[i] for p, i in zip(ports, indexes, strict=True)}))
        ok, marks = True, []
        for control in self.controls:
            _tag, total, wrong, sample, mark_times, closed = control.recv()
            if wrong or closed:
                print(f"  reader: {wrong} connections wrong (port, got, sent): {sample}, "
                      f"{closed} closed, {total} bytes")  # fmt: skip
                ok = False
            marks.append(mark_times)
        return ok, marks

    def _drain(self, sender: PlainSender | UringSender) -> None:
        deadline = time.monotonic() + DRAIN_TIMEOUT
        while not sender.idle() and time.monotonic() < deadline:
            time.sleep(TICK)

    def paced(
        self,
        sender: PlainSender | UringSender,
        rate: int,
        duration: float,
        work_us: float,
        per_us: float,
    ) -> dict[str, Any]:
        """``rate`` sends/s for ``duration`` s (fewer if the thread cannot keep up), and
        ``work_us`` of other Python work per delivery (``--work-us``): ``_burn`` iterations
        at ``per_us`` a us, that rate corrected from the CPU the passes' burns took."""
        count, total = len(self.socks), int(rate * duration)
        meter = Meter([p.pid for p in self.processes if p.pid is not None])
        start, done, cursor, behind, burned = time.perf_counter(), 0, 0, 0.0, 0.0
        burned_iterations = 0
        while done < total and (now := time.perf_counter() - start) < duration:
            due = min(int(now * rate), total) - done
            behind = max(behind, now - done / rate)
            if work_us and due:
                iterations = round(due * work_us * per_us)
                burn_start = time.thread_time()
                _burn(iterations)
                burned += time.thread_time() - burn_start
                burned_iterations += iterations
                if burned > 0.05:  # enough to measure: the rate as the passes burn
                    per_us = burned_iterations / (burned * 1e6)
            for _ in range(due):
                sender.send(cursor)
                self.sent[cursor] += len(FRAME)
                cursor = cursor + 1 if cursor + 1 < count else 0
            sender.flush()
            done += due
            if now - done / rate < TICK:  # on schedule: the loop waits, as in epoll
                time.sleep(TICK)
        elapsed = time.perf_counter() - start
        self._drain(sender)
        result = meter.stop(done) | {"deliveries": done, "behind_max_ms": behind * 1e3}
        result["rate"] = done / elapsed
        result["burn_us"] = burned * 1e6 / max(done, 1)  # the stand-in's own measured CPU
        result["counts"] = sender.close()
        result["complete"], _marks = self.check()
        return result

    def sweep(
        self, sender: PlainSender | UringSender, rounds: int, interval: float
    ) -> dict[str, Any]:
        count = len(self.socks)
        bases = [sum(self.sent[i] for i in indexes) for indexes in self.indexes]
        for control, base, indexes in zip(self.controls, bases, self.indexes, strict=True):
            step = len(indexes) * len(FRAME)
            control.send(("marks", [base + (k + 1) * step for k in range(rounds)]))
        time.sleep(0.2)
        meter = Meter([p.pid for p in self.processes if p.pid is not None])
        starts, walls, cpu = [], [], 0.0
        begin = time.monotonic()
        for k in range(rounds):
            time.sleep(max(0.0, begin + k * interval - time.monotonic()))
            c0, t0 = time.thread_time(), time.monotonic()
            sender.flush()  # the previous round's completions (uring), its outbox (send)
            for index in range(count):
                sender.send(index)
                self.sent[index] += len(FRAME)
            sender.flush(force=True)
            walls.append(time.monotonic() - t0)
            cpu += time.thread_time() - c0
            starts.append(t0)
        time.sleep(interval)
        c0 = time.thread_time()
        self._drain(sender)
        cpu += time.thread_time() - c0
        result = meter.stop(rounds * count) | {"deliveries": rounds * count}
        result["thread_us_in_sweeps"] = cpu * 1e6 / (rounds * count)
        result["counts"] = sender.close()
        result["complete"], marks = self.check()
        spans = [
            max(times[k] for times in marks) - starts[k]
            for k in range(rounds) if all(len(times) > k for times in marks)
        ]  # fmt: skip
        result["submit_wall_us"] = statistics.median(walls) * 1e6 / count
        result["last_reader_ms"] = [
            statistics.median(spans) * 1e3, max(spans) * 1e3
        ] if spans else None  # fmt: skip
        return result


def _line(result: dict[str, Any]) -> str:
    text = (
        f"{result['shape']:>5} {result['connections']:>6} {result['method']:>6}: "
        f"thread {result['thread_us']:5.2f} us/delivery, process {result['process_us']:5.2f}, "
        f"other threads {result['sq_thread_us']:5.2f} (iou-sqp {result['iou-sqp_us']:.2f}, "
        f"iou-wrk {result['iou-wrk_us']:.2f}, exited {result['exited_us']:.2f}, "
        f"{result['iou_wrk_alive']} iou-wrk alive), readers {result['readers_us']:5.2f}, "
        f"machine {result['machine_pct']:3.0f} % (this benchmark {result['ours_pct']:3.0f} %)"
    )
    if result["shape"] == "sweep":
        spans = result["last_reader_ms"]
        text += (
            f"; in sweeps {result['thread_us_in_sweeps']:5.2f} us, submit wall "
            f"{result['submit_wall_us']:5.2f} us/conn, last reader "
            + (f"p50 {spans[0]:.1f} max {spans[1]:.1f} ms" if spans else "n/a")
        )
    else:
        text += (
            f"; stand-in {result['burn_us']:.2f} us of it"
            f"; {result['rate']:,.0f} sends/s, behind schedule max {result['behind_max_ms']:.1f} ms"
        )
    counts = result["counts"]
    if result["method"].startswith("sqpoll") and "SqTotalTime" in counts:  # us since set-up
        per = result["deliveries"]
        text += (
            f"; SQ thread awake {int(counts['SqTotalTime']) / per:5.2f} us/delivery, "
            f"working {int(counts['SqWorkTime']) / per:5.2f}"
        )
    complete = "all bytes arrived" if result["complete"] else "BYTES MISSING"
    return f"{text}; {complete}; {result['counts']}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, nargs="+", default=[10000, 1000])
    parser.add_argument("--rate", type=int, default=40000)
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--interval", type=float, default=0.25)
    parser.add_argument("--methods", nargs="+", default=["send", "sqpoll", "uring"],
                        choices=["send", "sqpoll", "uring", "async", "sqpoll-lazy"])  # fmt: skip
    parser.add_argument("--shapes", nargs="+", default=["paced", "sweep"],
                        choices=["paced", "sweep"])  # fmt: skip
    parser.add_argument("--readers", type=int, default=2)
    parser.add_argument("--sq-idle-ms", type=int, default=10)
    parser.add_argument("--sq-cpu", type=int, default=None, help="pin the SQ thread")
    parser.add_argument(
        "--iowq-workers",
        type=int,
        default=0,
        help="async: cap the io-wq workers (0: the kernel's default)",
    )
    parser.add_argument(
        "--lazy-submit-ms",
        type=float,
        default=5.0,
        help="sqpoll-lazy: publish the SQ tail this often",
    )
    parser.add_argument(
        "--async-submit-ms", type=float, default=0.0,
        help="async: enter the kernel only this often (0: every ~1 ms pass)",
    )  # fmt: skip
    parser.add_argument("--lazy-idle-ms", type=int, default=1, help="sqpoll-lazy: sq_thread_idle")
    parser.add_argument(
        "--work-us",
        type=float,
        default=0.0,
        help="other Python work per delivery on the sending thread (paced)",
    )
    parser.add_argument("--json", type=Path, default=None)
    options = parser.parse_args()
    options.duration = min(options.duration, 20.0)
    options.rounds = min(options.rounds, 200)
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    per_us = _iterations_per_us() if options.work_us else 0.0
    results = []
    for count in options.connections:
        harness = Harness(count, options.readers)
        try:
            time.sleep(0.5)
            for shape in options.shapes:
                for method in options.methods:
                    try:
                        sender = harness.sender(method, options)
                    except RingError as error:
                        print(f"{shape:>5} {count:>6} {method:>6}: io_uring unavailable: "
                              f"errno {error.errno} {error}")  # fmt: skip
                        continue
                    if shape == "paced":
                        result = harness.paced(
                            sender, options.rate, options.duration, options.work_us, per_us
                        )
                    else:
                        result = harness.sweep(sender, options.rounds, options.interval)
                    result.update(shape=shape, connections=count, method=method)
                    print(_line(result), flush=True)
                    results.append(result)
                    time.sleep(0.3)
        finally:
            harness.close()
    if options.json:
        options.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
