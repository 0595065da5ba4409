"""The Workers supervisor's stdout never stalls it (cluster/stdout_lines.py).

It printed its lines (``listening``, ``monitoring``, ``worker I pid P`` at each restart)
with a blocking write on its event loop, where the sequencer runs: a pipe nobody read
stopped the whole server once 64 KiB waited in it. Here a real :class:`Supervisor` (its
sequencer and held port included) runs in a process whose stdout is a pipe this test
never reads; two stand-in workers (no processes) hand it 400 kB of lines to pass on.
The supervisor must keep its loop turning, stop on SIGTERM and exit.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.stdout_lines import StdoutLines

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import os, signal, sys
import trio, trio.testing
from cluster.workers import Supervisor
from migratory.config import load_config

LINES = 2000  # 100 bytes each, per worker: 400 kB, six pipes' worth
fed = []

class StandIn:  # what the supervisor asks of a worker process
    def __init__(self, pid):
        self.pid, self.returncode = pid, None
    def send_signal(self, sig):
        self.returncode = -sig
    def kill(self):
        self.returncode = -9
    async def wait(self):
        return self.returncode

class Supervised(Supervisor):
    async def _keep(self, slot):
        slot.process = StandIn(100_000 + slot.index)
        into, out = trio.testing.memory_stream_one_way_pair()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._relay, slot, out)
            await into.send_all(b"listening ws://127.0.0.1:1\n")
            while not self.announced:
                await trio.sleep(0.01)
            for n in range(LINES):
                await into.send_all(b"monitoring %-80d\n" % n)
            fed.append(slot.index)
        await trio.sleep_forever()

async def main():
    config = load_config(overrides={"Listen": "127.0.0.1:0", "Workers": "2"}, environ={})
    supervisor = Supervised(config, [])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(supervisor.run)
        for _ in range(3000):  # bounded: every line handed over, through the loop
            if len(fed) == 2:
                break
            await trio.sleep(0.01)
        turns = 0
        for _ in range(200):  # the loop still turns with the pipe full
            await trio.sleep(0)
            turns += 1
        print(f"fed {len(fed)} turns {turns} written {supervisor.output.written}",
              file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)  # the supervisor's own stop

trio.run(main)
print("stopped", file=sys.stderr, flush=True)
"""


def test_a_stdout_nobody_reads_does_not_stall_the_supervisor(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MIGRATORY_")}
    env["PYTHONPATH"] = str(ROOT)
    err = tmp_path / "stderr"
    with err.open("wb") as stderr:
        process = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE,
                                   stderr=stderr, env=env, cwd=ROOT)
        try:
            code = process.wait(timeout=60)  # a bound on a hang, not a speed figure
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            code = None
        finally:
            assert process.stdout is not None
            process.stdout.close()
    said = err.read_text()
    assert code == 0, f"the supervisor stalled on its stdout (exit {code}): {said[-2000:]}"
    assert "fed 2 turns 200" in said and "stopped" in said


def test_lines_are_written_in_order_and_dropped_past_the_bound(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import trio

    read, write = os.pipe()
    os.set_blocking(read, False)
    lines = StdoutLines(write, max_waiting=5)
    got = bytearray()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lines.run)
            for n in range(8):  # 5 wait, 3 dropped: nothing written before run turns
                lines.say(f"line {n}")
            for _ in range(200):
                await trio.sleep(0.01)
                if lines.idle:
                    break
            lines.say("after")
            await lines.drained()
            nursery.cancel_scope.cancel()

    trio.run(main)
    got += os.read(read, 65536)
    os.close(read)
    os.close(write)
    assert got.decode().splitlines() == [f"line {n}" for n in range(5)] + ["after"]
    assert any("3 lines were dropped" in r.getMessage() for r in caplog.records)


def test_each_workers_monitoring_line_comes_out_in_its_turn_however_its_lines_arrive() -> None:
    """Worker 1 announces itself whole; worker 0's lines reach the supervisor one read at
    a time, and the supervisor gets to run between two reads (a busy machine). Each
    worker's lines must come out in worker order, before its ``worker I pid P`` line:
    a test (and a tool) takes the i-th ``monitoring`` line for worker i's, and reads the
    pid lines as "every worker is announced". The worker printed its monitoring line
    after its ``listening`` lines, which make it ready: when the last ready worker's
    monitoring line came after the announcement, it was printed last -- worker 1's port
    where worker 0's was expected (CI: the MQTT session test killed the worker that did
    not hold the session, so its device never lost its connection)."""
    import trio
    import trio.testing

    from cluster.worker import announcement
    from cluster.workers import Supervisor
    from migratory.config import load_config

    config = load_config(overrides={"Listen": "127.0.0.1:0", "Workers": "2"}, environ={})
    supervisor = Supervisor(config, [])
    read, write = os.pipe()
    supervisor.output = StdoutLines(write)
    url = "ws://127.0.0.1:8800"
    lines = {i: announcement([url], f"http://127.0.0.1:{9000 + i}") for i in (0, 1)}

    class StandIn:
        def __init__(self, pid: int) -> None:
            self.pid = pid

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(supervisor.output.run)
            feeds = {}
            for slot in supervisor.slots:
                slot.process = StandIn(100_000 + slot.index)  # type: ignore[assignment]
                feeds[slot.index], out = trio.testing.memory_stream_one_way_pair()
                nursery.start_soon(supervisor._relay, slot, out)
            nursery.start_soon(supervisor._announce_when_ready)
            await feeds[1].send_all("".join(f"{line}\n" for line in lines[1]).encode())
            for line in lines[0]:  # one read each, the supervisor running in between
                await feeds[0].send_all(f"{line}\n".encode())
                await trio.testing.wait_all_tasks_blocked()
            with trio.fail_after(10):  # a bound on a hang, not a speed figure
                while not supervisor.announced:
                    await trio.sleep(0.01)
                await supervisor.output.drained()
            nursery.cancel_scope.cancel()

    trio.run(main)
    said = os.read(read, 65536).decode().splitlines()
    os.close(read)
    os.close(write)
    assert said == [
        f"listening {url}",
        "monitoring http://127.0.0.1:9000", "worker 0 pid 100000",
        "monitoring http://127.0.0.1:9001", "worker 1 pid 100001",
    ], said
