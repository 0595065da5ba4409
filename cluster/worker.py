"""One worker process of a server with ``Workers = N > 1`` (docs/workers.md).

A worker serves clients on the shared ports (SO_REUSEPORT) and numbers nothing: it is
a non-seed whose only seed is the sequencer of its supervising process
(:mod:`cluster.sequencer`). It forwards its clients' publishes there and applies the
numbered stream that comes back -- the same :class:`~cluster.upstream.UpstreamReplication`,
:class:`~cluster.stream.CommittedStream` and readiness as a cluster's non-seed, so a
worker's crash is a non-seed's crash: its clients reconnect (through the same port, to
another worker) and resume from their positions with ``DATA_SYNC``.

It tells its supervisor it is ready (the ``listening`` lines on stdout) only once it
has caught up with the sequencer, and stops (as on SIGINT) when its supervisor is gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import secrets
import select
import signal
import sys
from dataclasses import replace
from typing import Any, TextIO

import trio

from cluster import link
from cluster.coordination import UNNUMBERED_EPOCH
from cluster.forwarding import Outgoing
from cluster.publishing import ClusterPublishing
from cluster.readiness import HOUSEKEEPING_SECONDS, Readiness, keep_house
from cluster.replica import Replica
from cluster.sequencer import worker_name
from cluster.stream import CommittedStream
from cluster.upstream import UpstreamReplication
from migratory.config import Config
from migratory.config_workers import BEAT_SECONDS
from migratory.logs import print_line
from migratory.server.app import Server, build_hub

log = logging.getLogger("migratory.workers")

READY_LOG_SECONDS = 5.0
PR_SET_PDEATHSIG = 1
BEAT_LINE = "worker beat"
"""Written on stdout every BEAT_SECONDS by a worker's event loop: its supervisor kills
and restarts a worker that stops (``WorkerHangTime``; :mod:`cluster.workers`)."""


def beat(out: TextIO) -> bool:
    """One heartbeat line on ``out`` if its pipe has room (False: skipped). A supervisor
    that reads nothing for long (held with SIGSTOP: ~45 minutes of 12-byte beats fill a
    64 KiB pipe) must not stop this worker's event loop on a blocking write: its
    clients are still told to go away (1013) while the sequencer is silent."""
    _, room, _ = select.select([], [out], [], 0)
    if not room:
        return False
    out.write(BEAT_LINE + "\n")  # one write (as print_line's)
    out.flush()
    return True


def thaw_when_orphaned() -> None:
    """Ask Linux to send this worker SIGCONT when its supervisor dies (prctl PDEATHSIG).

    A worker frozen (SIGSTOP, a debugger) when its supervisor is SIGKILLed would
    otherwise stay stopped as an orphan that holds every client port -- its listening
    sockets still take 1/N of the new connections, which wait for ever, and a server
    started again on the port is refused it. Continued, its event loop notices that
    its supervisor is gone and stops as the others do (:meth:`WorkerNode._watch_parent`,
    which also covers a supervisor gone before this call). A running worker ignores
    SIGCONT. (Not SIGKILL: a worker that runs closes its clients as it stops.)"""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGCONT), 0, 0, 0)


def announcement(listening: list[str], monitoring: str | None) -> list[str]:
    """What a worker prints on stdout once it has caught up, in order: its ``monitoring
    URL`` line (with MonitorListen), then its ``listening URL`` lines -- last, because
    they are what its supervisor takes it for ready by. A worker's lines that come before
    them are held and printed with that worker's, in worker order, before its ``worker I
    pid P``; the monitoring line came after them, and when it reached the supervisor
    after the last worker was ready it was passed on out of turn: after the next worker's
    line (the i-th line then named another worker's port) and after the pid lines that
    say every worker is announced (``tests/cluster/test_workers_output.py``)."""
    lines = [] if monitoring is None else [f"monitoring {monitoring}"]
    return lines + [f"listening {url}" for url in listening]


def worker_config(config: Config, index: int) -> Config:
    """A worker's configuration: its own server name (in ``connected``, /stats, logs)."""
    return replace(config, server_name=f"{config.server_name}-{worker_name(index)}")


class WorkerNode:
    """A worker: a server whose positions come from the sequencer at ``sequencer``."""

    def __init__(
        self,
        config: Config,
        *,
        index: int,
        sequencer: tuple[str, int],
        password: str,
        parent: int | None = None,
    ) -> None:
        """``parent``: the supervisor's pid (None: this process's parent now). Given, a
        supervisor killed while this worker was starting is noticed: the worker's
        parent is then already another process (init), which it would otherwise watch."""
        self.config = config = worker_config(config, index)
        self.index = index
        self.name = worker_name(index)
        self.parent = os.getppid() if parent is None else parent
        hub = build_hub(config, epoch=UNNUMBERED_EPOCH, numbered_elsewhere=True)
        self.replica = Replica(hub)
        self.publishing = ClusterPublishing(
            origin=f"{self.name}#{secrets.token_hex(4)}",
            replica=self.replica,
            max_pending=config.cluster_max_pending_publishes,
        )
        self.stream = CommittedStream(self.publishing, is_ready=self._is_ready)
        self.upstream = UpstreamReplication(
            name=self.name,
            seeds=[sequencer],
            password=password,
            stream=self.stream,
            outgoing=Outgoing(self.publishing),
            # a loopback link: no linger; what arrives while a forward is written shares
            # the next one
            forward_linger=0,
            max_frame=link.connected_frame_limit(config.max_frame_size),
        )
        self.readiness = Readiness(
            self.replica, self.upstream.not_ready_reason, clock=trio.current_time
        )
        self.server = Server(
            config,
            hub=hub,
            publishing=self.publishing,
            readiness=self.readiness.reason,
            cluster_status=self.status,
        )

    def _is_ready(self) -> bool:
        return self.readiness.reason() is None

    def status(self) -> dict[str, Any]:
        reason = self.readiness.reason()
        return {
            "member": self.config.server_name,
            "server_name": self.config.server_name,
            "mode": "Workers",
            "role": "worker",
            "worker": self.index,
            "workers": self.config.workers,
            "pid": os.getpid(),
            "ready": reason is None,
            "not_ready_reason": reason,
            "applied_clsn": self.replica.applied_clsn,
            "publishing": self.publishing.statistics(),
        }

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Replicate from the sequencer and watch the supervisor."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self.upstream.run)
            nursery.start_soon(self._watch_parent)
            nursery.start_soon(self._announce_when_ready)
            if self.config.worker_hang_time:
                nursery.start_soon(self._beat)
            nursery.start_soon(
                functools.partial(
                    keep_house, self.name, self.publishing, self.readiness, self.server,
                    cut_off="worker cut off", sent_to="away",
                )
            )
            task_status.started()

    async def _announce_when_ready(self) -> None:
        """Print the ``listening`` lines (the supervisor waits for them) once this worker
        has caught up with the sequencer."""
        waited = 0.0
        while (reason := self.readiness.reason()) is not None:
            await trio.sleep(0.02)
            waited += 0.02
            if waited >= READY_LOG_SECONDS:
                log.info("%s not ready yet: %s", self.name, reason)
                waited = 0.0
        monitoring = None
        if self.server.monitor_address is not None:
            host, port = self.server.monitor_address
            scheme = "https" if self.config.monitor_encrypted else "http"
            monitoring = f"{scheme}://{host}:{port}"
        listening = [listener.url().rstrip("/") for listener in self.server.listeners]
        for line in announcement(listening, monitoring):
            print_line(line)

    async def _beat(self) -> None:
        """Tell the supervisor this event loop turns."""
        while True:
            beat(sys.stdout)
            await trio.sleep(BEAT_SECONDS)

    async def _watch_parent(self) -> None:
        """Stop, as on Ctrl-C, once the supervisor is gone (its sequencer with it)."""
        while os.getppid() == self.parent:
            await trio.sleep(HOUSEKEEPING_SECONDS)
        log.error("%s: the supervising process %d is gone; stopping", self.name, self.parent)
        os.kill(os.getpid(), signal.SIGINT)
