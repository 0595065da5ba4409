"""The parent's side of the load processes, and the run around the server under test.

Load processes are forked (``multiprocessing`` "fork" context) and talk to the
parent over pipes: ``receive`` collects one message of a kind from each,
``split`` shares the connections out, ``stop_processes`` ends them by their
own PIDs. ``run_against`` starts a local server when no URL was given, runs a
pattern and always stops what it started.

Every loop here is bounded by a deadline (``time.monotonic``) and by the
number of connections it handles.
"""

from __future__ import annotations

import multiprocessing.connection as mpc
import sys
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from typing import Any

from migratory.bench.procfs import handle_sigterm, machine_description
from migratory.bench.server_process import ServerProcess
from migratory.bench.target import Target

# every load process connects from 127.0.0.1: lift the per-address and rate limits
# (docs/security.md) of a server the bench starts; later --set values still win
UNLIMITED = ["MaxConnectionsPerAddress=0", "MaxHandshakesPerAddress=0", "MaxPublishesPerSecond=0",
             "MaxConnectionRatePerAddress=0", "MaxTlsHandshakeRate=0"]

Pattern = Callable[[Target, list[BaseProcess]], dict[str, Any] | None]


def receive(pipes: list[mpc.Connection], kind: str, timeout: float) -> list[tuple[Any, ...]]:
    """One message of ``kind`` from every pipe, within ``timeout`` seconds overall."""
    deadline = time.monotonic() + timeout
    index = {id(pipe): i for i, pipe in enumerate(pipes)}
    got: dict[int, tuple[Any, ...]] = {}
    while len(got) < len(pipes):
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"{len(pipes) - len(got)} load process(es) sent no {kind!r}")
        waiting = [pipe for i, pipe in enumerate(pipes) if i not in got]
        for pipe in mpc.wait(waiting, left):
            assert isinstance(pipe, mpc.Connection)
            i = index[id(pipe)]
            try:
                msg = pipe.recv()
            except EOFError:
                raise RuntimeError(f"load process {i} died before sending {kind!r}") from None
            if msg[0] != kind:
                raise RuntimeError(f"load process {i} sent {msg[0]!r}, expected {kind!r}")
            got[i] = msg
    return [got[i] for i in range(len(pipes))]


def split(total: int, parts: int) -> list[tuple[int, int]]:
    """(first index, count) of ``parts`` nearly equal shares of ``total``."""
    out = []
    first = 0
    for k in range(parts):
        count = total // parts + (1 if k < total % parts else 0)
        out.append((first, count))
        first += count
    return out


def stop_processes(procs: list[BaseProcess]) -> None:
    """Terminate, then kill, the load processes still alive (by their own PIDs)."""
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
            proc.join(3)
        if proc.is_alive():
            proc.kill()
            proc.join(3)


def local_server(kind: str, settings: list[str], *, mqtt: bool) -> ServerProcess:
    """A migratory server on 127.0.0.1 (free ports) with the load limits lifted."""
    extra = ["ListenMqtt=127.0.0.1:0"] if mqtt and not any(
        s.startswith("ListenMqtt=") for s in settings
    ) else []
    return ServerProcess(kind, [*UNLIMITED, *extra, *settings])


def server_target(server: ServerProcess) -> Target:
    return Target(
        name="migratory",
        protocol="native",
        host=server.host,
        port=server.port,
        mqtt_port=server.mqtt_port,
        pid=server.pid,
        stats=True,
    )


def run_against(
    target: Target | None, run: Pattern, *, kind: str, settings: list[str], mqtt: bool = False
) -> dict[str, Any] | None:
    """Run a pattern against ``target``, or against a local server started for it (None).

    Load processes and the local server are always stopped (by PID), also on
    errors and Ctrl-C. Returns the result with the machine description, or None
    when the run could not complete (the reason is printed on stderr).
    """
    handle_sigterm()
    server = None if target is not None else local_server(kind, settings, mqtt=mqtt)
    procs: list[BaseProcess] = []
    result: dict[str, Any] | None = None
    try:
        if server is not None:
            server.start()
            target = server_target(server)
            print(
                f"server pid {server.pid} on {server.host}:{server.port}, log {server.log_path}",
                file=sys.stderr,
                flush=True,
            )
        assert target is not None
        result = run(target, procs)
    # Ctrl-C (KeyboardInterrupt) and SIGTERM (SystemExit) go on up once the finally
    # has stopped everything: the command says it and exits 130 / 143 (they were taken
    # here: "interrupted", then --compare went on to the next broker, exit status 2)
    except (RuntimeError, TimeoutError, ValueError, OSError) as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
    finally:
        stop_processes(procs)
        if server is not None:
            server.stop()
    if server is not None:
        if result is None:
            print(f"server log: {server.log_path}\n{server.log_tail()}", file=sys.stderr)
        else:
            result["server_log"] = server.log_summary()
    if result is not None:
        result["target"] = {"name": target.name, "url": target.url} if target else {}
        result["machine"] = machine_description()
    return result
