"""The supervising process of a server with ``Workers = N > 1`` (docs/workers.md).

It does no client I/O. It

- holds each client port (an SO_REUSEPORT socket bound, never listening, so the port
  stays the server's while a worker restarts; port 0 is chosen here, once, for all),
  and refuses one that something listens on already, or that overlaps another of its
  listeners, as a single server would (:func:`listen_probe`);
- runs the :class:`~cluster.sequencer.Sequencer` (the one source of positions);
- starts N worker processes (``migratory serve`` with the same configuration, plus
  ``--worker-index`` / ``--worker-sequencer`` / ``--worker-parent``; the link secret in
  the environment),
  each in its own session so a terminal's Ctrl-C reaches them only through here;
- prints ``listening URL`` once every worker has caught up (tests and tools read it,
  first, as from a single server), then the workers' ``monitoring URL`` lines and
  ``worker I pid P`` for each, and ``worker I pid P`` again for every restart (off its
  event loop: :mod:`cluster.stdout_lines`);
- restarts a worker that stops on its own (logged, with a back-off if it keeps dying),
  and kills (then restarts) one whose heartbeats stop for ``WorkerHangTime`` seconds
  (:func:`kill_if_hung`): a hung worker would keep 1/N of the new connections waiting;
- on SIGINT or SIGTERM, whenever it comes (during start-up too: then no ``listening``
  line is printed), passes the signal on to every worker (SIGTERM to one still
  starting), waits for them (SIGTERM: up to DrainTime, as each drains), SIGKILLs any
  left, and stops.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import secrets
import signal
import socket
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

import trio

from cluster.sequencer import Sequencer
from cluster.stdout_lines import StdoutLines
from cluster.worker import BEAT_LINE
from cluster.worker_process import WorkerProcess
from migratory import stop_signals
from migratory.config import Config
from migratory.config_workers import BEAT_SECONDS
from migratory.listeners import client_listeners
from migratory.server.gc_pauses import tune

log = logging.getLogger("migratory.workers")

SECRET_ENV = "MIGRATORY_WORKER_SECRET"
START_TIMEOUT = 60.0
RESTART_DELAY = 0.2
RESTART_DELAY_MAX = 5.0
QUICK_DEATH = 5.0
"""A worker that dies this soon after it started is restarted after a growing delay."""
STOP_GRACE = 5.0
OUTPUT_GRACE = 0.5
"""Seconds the stopped supervisor waits for its last stdout lines to be read."""


class WorkerFailed(Exception):
    """A worker stopped before it was ready the first time: the server does not start.
    ``code``: the worker's exit status (2: it found the configuration bad, and said why)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


@dataclass(slots=True)
class WorkerSlot:
    index: int
    process: WorkerProcess | None = None
    listening: list[str] = field(default_factory=list)
    held_lines: list[str] = field(default_factory=list)
    """Other stdout lines of its first start, printed after the ``listening`` lines."""
    ready: trio.Event = field(default_factory=trio.Event)
    restarts: int = 0
    serving: bool = False
    """Its current process has caught up and serves (it would drain on SIGTERM)."""
    beats: int = 0
    """Heartbeats of its current process (WorkerHangTime)."""


def hold_ports(config: Config) -> tuple[list[socket.socket], dict[str, str]]:
    """One bound SO_REUSEPORT socket per client listener (never listening: the kernel
    gives connections only to the workers'), and the ``--set`` overrides that give the
    workers the ports chosen for port 0. Each address is checked as a single server
    would bind it (:func:`listen_probe`); the probes listen until every address is
    checked, then close."""
    held: list[socket.socket] = []
    probes: list[socket.socket] = []
    overrides: dict[str, str] = {}
    try:
        for key, addresses in (
            ("Listen", config.listen),
            ("ListenEncrypted", config.listen_encrypted),
            ("ListenMqtt", config.listen_mqtt),
            ("ListenMqttEncrypted", config.listen_mqtt_encrypted),
        ):
            resolved = []
            for host, port in addresses:
                sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
                held.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                try:
                    sock.bind((host, port))
                    bound = sock.getsockname()[1]
                    probes.append(listen_probe(sock.family, host, bound))
                except OSError as exc:
                    raise OSError(
                        exc.errno, f"cannot listen on {host}:{port} ({key}): {exc.strerror}"
                    ) from None
                resolved.append(f"[{host}]:{bound}" if ":" in host else f"{host}:{bound}")
            if any(port == 0 for _, port in addresses):
                overrides[key] = ", ".join(resolved)
    except BaseException:
        for sock in held:
            sock.close()
        raise
    finally:
        for probe in probes:
            probe.close()
    return held, overrides


def listen_probe(family: socket.AddressFamily, host: str, port: int) -> socket.socket:
    """A socket listening on ``host:port`` as a single server's listener would (no
    SO_REUSEPORT; SO_REUSEADDR, and IPV6_V6ONLY, as trio's listeners); OSError
    (EADDRINUSE) where a single server could not listen:

    - something listens there already. The held socket's SO_REUSEPORT would let it join
      the listeners of any process of the same user -- another server with workers
      started on the same port, or the orphaned workers of a killed one -- and the
      kernel would then split the clients between two servers that know nothing of
      each other's messages;
    - one of this server's own listeners overlaps an earlier one (``0.0.0.0:P`` and
      ``127.0.0.1:P``: the probe of the first still listens). The workers, each binding
      both with SO_REUSEPORT, took such a configuration that a single server refuses,
      and the connections to ``127.0.0.1:P`` all went to the more specific listener,
      whatever it speaks (an MQTT-only one: every WebSocket client refused).

    Connections in TIME_WAIT and this server's own bound, never listening sockets do
    not count. The caller closes the probe."""
    probe = socket.socket(family)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        probe.bind((host, port))
        probe.listen(1)
    except BaseException:
        probe.close()
        raise
    return probe


def warn_if_more_than_cores(workers: int) -> None:
    """Workers beyond the cores this process may run on add memory (each a replica of
    every cache) and start-up time (about 0.4 s more per worker on 2 busy cores), not
    throughput: said once, naming the key."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if cores is not None and workers > cores:
        log.warning("Workers = %d is more than the cores this server may run on (%d): each "
                    "worker beyond them adds memory (a replica of every cache) and no "
                    "throughput; Workers = %d uses them all (docs/workers.md)",
                    workers, cores, cores)


def monitor_override(config: Config, index: int) -> dict[str, str]:
    """Worker ``index`` answers MonitorListen's port + index (port 0: its own free port)."""
    if config.monitor_listen is None or config.monitor_listen[1] == 0:
        return {}
    host, port = config.monitor_listen
    return {"MonitorListen": f"{host}:{port + index}"}


class Supervisor:
    def __init__(
        self, config: Config, serve_args: Sequence[str], config_text: str | None = None
    ) -> None:
        """``serve_args``: the ``migratory serve`` options to start each worker with;
        ``config_text``: the text of their ``--config`` file as read at start-up, given
        to every worker (restarted ones too) on its stdin."""
        self.config = config
        self.serve_args = list(serve_args)
        self.config_text = config_text
        self.secret = secrets.token_hex(24)
        self.sequencer = Sequencer(config, workers=config.workers, password=self.secret)
        self.slots = [WorkerSlot(i) for i in range(config.workers)]
        self.stopping = False
        self.announced = False
        """The ``listening`` lines are out: from now on worker lines are passed on at once."""
        self._overrides: dict[str, str] = {}
        self._sequencer_address = ("127.0.0.1", 0)
        # stdout written off the loop: a reader that reads nothing never stalls the
        # sequencer (stdout_lines.py)
        self.output = StdoutLines()

    async def run(self) -> None:
        warn_if_more_than_cores(self.config.workers)
        held, self._overrides = hold_ports(self.config)
        try:
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                early = stop_signals.noted()  # before the receiver: start nothing
                if early is not None:
                    log.info("%s received during start-up: stopped", early.name)
                    return
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self.output.run)
                    self._sequencer_address = await nursery.start(self.sequencer.run)
                    tune(self.config.gc_thresholds)  # the caches live here: as a server does
                    for slot in self.slots:
                        nursery.start_soon(self._keep, slot)
                    # a signal stops the server whenever it comes, during start-up too
                    nursery.start_soon(self._announce_when_ready)
                    signum = await signals.__anext__()
                    if signum == signal.SIGTERM:  # the workers drain: a Ctrl-C cuts it short
                        nursery.start_soon(self._pass_on_sigint, signals)
                    await self._stop(signal.Signals(signum))
                    with trio.move_on_after(OUTPUT_GRACE):
                        await self.output.drained()
                    nursery.cancel_scope.cancel()
        finally:
            for sock in held:
                sock.close()

    async def _pass_on_sigint(self, signals: AsyncIterator[int]) -> None:
        """A SIGINT while the workers drain (SIGTERM) goes on to them: each stops at once
        (migratory/server/run.py), as the supervisor's terminal asked."""
        async for signum in signals:
            if signum != signal.SIGINT:
                log.info("%s received: stopping already", signal.Signals(signum).name)
                continue
            log.info("SIGINT received while the workers drain: passing it on")
            for slot in self.slots:
                if slot.process is not None and slot.process.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        slot.process.send_signal(signal.SIGINT)
            return

    async def _announce_when_ready(self) -> None:
        """Once every worker is ready: the ``listening`` lines, then each worker's; never
        once the server is stopping (a signal came first). Not ready within
        START_TIMEOUT: the start failed -- unless a stop began meanwhile, which then
        takes as long as it takes (a hung worker is waited for STOP_GRACE + DrainTime)."""
        with trio.move_on_after(START_TIMEOUT) as waited:
            for slot in self.slots:
                await slot.ready.wait()
        if self.stopping:
            return
        if waited.cancelled_caught:
            raise trio.TooSlowError
        for line in self.slots[0].listening:
            self.output.say(line)
        for slot in self.slots:
            for line in slot.held_lines:
                self.output.say(line)
            assert slot.process is not None
            self.output.say(f"worker {slot.index} pid {slot.process.pid}")
        self.announced = True
        log.info("%d workers ready: pids %s", len(self.slots),
                 ", ".join(str(s.process.pid) for s in self.slots if s.process is not None))

    def _command(self, index: int) -> list[str]:
        overrides = {**self._overrides, **monitor_override(self.config, index)}
        host, port = self._sequencer_address
        return [
            sys.executable, "-m", "cluster", "serve", *self.serve_args,
            *[f"--set={key}={value}" for key, value in overrides.items()],
            "--worker-index", str(index), "--worker-sequencer", f"{host}:{port}",
            # its parent by pid: one killed while the worker was still starting is gone
            # before the worker could ask who its parent is
            "--worker-parent", str(os.getpid()),
        ]

    async def _keep(self, slot: WorkerSlot) -> None:
        """Run worker ``slot.index`` for as long as the server runs; restart it when it
        stops on its own."""
        delay = RESTART_DELAY
        while not self.stopping:
            started = trio.current_time()
            try:
                code = await self._run_once(slot)
            except OSError as exc:  # not started: no file descriptor, no process left
                if not slot.ready.is_set():  # the server does not start (exit 1, saying why)
                    raise
                # a restart that cannot start now (a worker OOM-killed, the pids limit of
                # a container reached) must not stop the workers that serve: try again
                delay = min(delay * 2, RESTART_DELAY_MAX)
                log.error("worker %d could not be started (%s); trying again in %.1f s",
                          slot.index, exc.strerror or exc, delay)
                await trio.sleep(delay)
                continue
            if self.stopping:
                return
            how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
            if not slot.ready.is_set():
                raise WorkerFailed(f"worker {slot.index} stopped during start-up ({how})", code)
            slot.restarts += 1
            delay = delay * 2 if trio.current_time() - started < QUICK_DEATH else RESTART_DELAY
            delay = min(delay, RESTART_DELAY_MAX)
            log.warning("worker %d stopped (%s); restarting it in %.1f s (restart %d)",
                        slot.index, how, delay, slot.restarts)
            await trio.sleep(delay)

    async def _run_once(self, slot: WorkerSlot) -> int:
        env = {**os.environ, SECRET_ENV: self.secret}
        # from this thread, not trio's cache: the parent-death signal each worker asks for
        # comes when the starting thread ends (cluster/worker_process.py)
        process = WorkerProcess.start(
            self._command(slot.index), env=env, stdin=self.config_text is not None
        )
        slot.process = process
        slot.serving = False
        slot.beats = 0
        if self.announced:  # a restart (the first start's line follows "listening")
            self.output.say(f"worker {slot.index} pid {process.pid}")
        log.info("worker %d started (pid %d)", slot.index, process.pid)
        try:
            await self._give_config(process)
            assert process.stdout is not None
            async with trio.open_nursery() as nursery:
                nursery.start_soon(functools.partial(
                    kill_if_hung, slot, hang=self.config.worker_hang_time,
                    kill=functools.partial(self._kill_hung, slot, process),
                ))
                await self._relay(slot, process.stdout)  # until it exits (or is killed)
                nursery.cancel_scope.cancel()
            return await process.wait()
        finally:
            with trio.CancelScope(shield=True):
                if self.stopping or process.returncode is None:
                    await self._end(process)
                await process.aclose_streams()

    def _kill_hung(self, slot: WorkerSlot, process: WorkerProcess) -> None:
        log.error("worker %d sent no heartbeat for %d s (hung); killing it",
                  slot.index, self.config.worker_hang_time)
        with contextlib.suppress(ProcessLookupError):
            process.kill()

    async def _give_config(self, process: WorkerProcess) -> None:
        """The config file's text as the server started with it: a worker restarted
        after the file was edited (or removed) runs as its peers and the sequencer do,
        not with settings they never read, or not at all."""
        if process.stdin is None or self.config_text is None:
            return
        # a worker that died at once: its exit code says so
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await process.stdin.send_all(self.config_text.encode())
        await process.stdin.aclose()

    async def _relay(self, slot: WorkerSlot, stdout: trio.abc.ReceiveStream) -> None:
        """The worker's stdout: its ``listening`` lines mark it ready; the rest is
        passed on (``monitoring URL`` lines, one per worker)."""
        buffer = b""
        first_start = not slot.ready.is_set()
        listening: list[str] = []
        async for chunk in stdout:
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for raw in lines:
                line = raw.decode(errors="replace")
                if line == BEAT_LINE:
                    slot.beats += 1
                elif line.startswith("listening "):
                    listening.append(line)
                    if len(listening) == len(client_listeners(self.config)):
                        slot.listening = listening
                        slot.serving = True
                        if first_start:
                            slot.ready.set()
                        else:
                            log.info("worker %d is back", slot.index)
                elif not self.announced:
                    slot.held_lines.append(line)
                else:
                    self.output.say(line)

    async def _end(self, process: WorkerProcess) -> None:
        """Make sure ``process`` is gone (the supervisor is stopping or failed)."""
        if process.returncode is None:
            serving = any(s.process is process and s.serving for s in self.slots)
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(stop_signal(signal.SIGINT, serving=serving))
            with trio.move_on_after(STOP_GRACE):
                await process.wait()
        if process.returncode is None:
            log.warning("worker pid %d did not stop; killing it", process.pid)
            process.kill()
            await process.wait()

    async def _stop(self, signum: signal.Signals) -> None:
        """Pass ``signum`` on to every worker and wait for them to stop."""
        log.info("%s received%s: stopping %d workers", signum.name,
                 "" if self.announced else " during start-up", len(self.slots))
        self.stopping = True
        live = []
        for slot in self.slots:
            if slot.process is not None and slot.process.returncode is None:
                live.append(slot.process)
                with contextlib.suppress(ProcessLookupError):
                    slot.process.send_signal(stop_signal(signum, serving=slot.serving))
        grace = STOP_GRACE + (self.config.drain_time if signum == signal.SIGTERM else 0)
        with trio.move_on_after(grace):
            for process in live:
                await process.wait()
        for process in live:
            if process.returncode is None:
                log.warning("worker pid %d did not stop in %.0f s; killing it",
                            process.pid, grace)
                process.kill()
                await process.wait()
        log.info("stopped: %d workers (%d restarts)", len(self.slots),
                 sum(s.restarts for s in self.slots))


async def kill_if_hung(slot: WorkerSlot, *, hang: int, kill: Callable[[], None]) -> None:
    """Call ``kill`` once the worker's heartbeats (``slot.beats``) stop for ``hang``
    seconds (0: never); none yet is a worker still starting. Silence is counted in this
    task's own turns, each after the previous one let the relay read the pipe: a
    supervisor held up itself (SIGSTOP, a stalled machine) counts that as one turn, not
    as its workers silent all that time."""
    if not hang:
        return
    seen, silent = 0, 0
    while True:
        await trio.sleep(BEAT_SECONDS)
        if slot.beats != seen or seen == 0:
            seen, silent = slot.beats, 0
            continue
        silent += 1
        if silent * BEAT_SECONDS >= hang:
            kill()
            return


def stop_signal(signum: signal.Signals, *, serving: bool) -> signal.Signals:
    """What stops a worker: ``signum`` once it serves; SIGTERM while it starts (it has
    no clients to drain yet; before its event loop runs, either signal stops it with one
    line, migratory/stop_signals.py)."""
    return signum if serving else signal.SIGTERM


def serve_args(config_path: str | None, sets: Sequence[str]) -> list[str]:
    """The ``serve`` options a worker is started with: the supervisor's own."""
    args = [] if config_path is None else ["--config", config_path]
    return args + [f"--set={item}" for item in sets]


async def supervise(config: Config, args: Sequence[str], config_text: str | None = None) -> None:
    await Supervisor(config, args, config_text).run()
