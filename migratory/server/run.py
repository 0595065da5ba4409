"""Running a server (and its roles) until SIGINT or SIGTERM, and stopping it: at once on
SIGINT, after a drain (DrainTime) on SIGTERM -- cut short by a SIGINT during it; a
stop signal that came before the event loop ran (migratory/stop_signals.py) stops it
before it starts anything (README, "Starting and stopping")."""

from __future__ import annotations

import functools
import logging
import signal
from collections.abc import AsyncIterator, Sequence

import trio

from migratory import stop_signals
from migratory.logs import print_line
from migratory.server.app import LeavingRole, Role, Server
from migratory.server.gc_pauses import GcPauses, collect_when_idle, tune
from migratory.server.listen_sockets import raise_open_file_limit

log = logging.getLogger("migratory.server")


async def run_until_signalled(
    server: Server, *, roles: Sequence[Role] = (), ready_line: bool = True
) -> None:
    """Serve (and run ``roles``) until SIGINT/SIGTERM, then shut down cleanly; a stop
    signal that came before the event loop ran (migratory/stop_signals.py) stops it
    before it starts anything."""
    limit = raise_open_file_limit()
    pauses = GcPauses()
    server.ctx.gc_pauses = pauses.stats
    with pauses, trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        early = stop_signals.noted()
        if early is not None:
            log.info("%s received during start-up: shutting down", early.name)
        else:
            await _serve_until_signal(
                server, roles, signals, pauses=pauses, limit=limit, ready_line=ready_line
            )
    stats = server.ctx.statistics()
    log.info(
        "stopped: %d connections served, %d messages published, %d deliveries, "
        "%d slow consumers cut off",
        stats["connections_accepted"],
        stats["messages_published"],
        stats["frames_fanned_out"],
        stats["slow_consumers"],
    )
    if server.ctx.audit is not None:
        server.ctx.audit.close()


async def _serve_until_signal(
    server: Server, roles: Sequence[Role], signals: AsyncIterator[int], *, pauses: GcPauses,
    limit: int, ready_line: bool,
) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        for role in roles:
            await nursery.start(role.run)
        # what start-up built is never scanned again
        tune(server.config.gc_thresholds, pauses=pauses)
        ready = server.ctx.readiness
        nursery.start_soon(functools.partial(
            collect_when_idle, server.activity, pauses.stats,
            ready=lambda: ready() is None,
        ))
        for listener in server.listeners:
            log.info("listening on %s (open-file limit %d)", listener.describe(), limit)
            if ready_line:  # tests and tools read these lines
                print_line(f"listening {listener.url().rstrip('/')}")
        if server.monitor_address is not None:
            host, port = server.monitor_address
            scheme = "https" if server.config.monitor_encrypted else "http"
            log.info("monitoring on %s://%s:%d/ (/metrics, /stats, /cluster)",
                     scheme, host, port)
            if ready_line:
                print(f"monitoring {scheme}://{host}:{port}", flush=True)
        async for signum in signals:
            log.info("%s received: shutting down", signal.Signals(signum).name)
            break
        drained = False
        if signum == signal.SIGTERM:  # Kubernetes, service managers: drain first
            with trio.CancelScope() as draining:
                nursery.start_soon(_cut_short_by_sigint, signals, draining)
                await server.drain.run(lambda: server.connections)
            drained = not draining.cancel_called
        await server.shutdown()
        for role in roles if drained else ():  # (not after a SIGINT: at once)
            if isinstance(role, LeavingRole):
                await role.leave()
        nursery.cancel_scope.cancel()


async def _cut_short_by_sigint(signals: AsyncIterator[int], draining: trio.CancelScope) -> None:
    """A SIGINT (Ctrl-C) during a SIGTERM's drain stops the server at once, as it does
    before one: the operator who pressed it does not wait up to DrainTime for nothing."""
    async for signum in signals:
        if signum == signal.SIGINT:
            log.info("SIGINT received while draining: stopping at once")
            draining.cancel()
            return
        log.info("%s received: draining already", signal.Signals(signum).name)
