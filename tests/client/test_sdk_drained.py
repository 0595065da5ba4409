"""A server that drains (SIGTERM) closes with 4502 DRAINED after every status it owes:
the SDK then reports a publish still waiting as definitely not published, never as
unknown, and reconnects."""

from __future__ import annotations

import signal
import time
from typing import Any

import trio

from migratory.protocol import close_codes
from migratory.protocol.ops import Status
from migratory_client import PublishOutcomeUnknown, ReconnectPolicy, connect
from migratory_client.notifications import NotificationQueue
from migratory_client.routing import PendingPublish, Router


def test_publishes_waiting_at_a_drained_close_fail_definitely() -> None:
    router = Router(NotificationQueue(16))
    drained, lost = PendingPublish("/a/b", "c1"), PendingPublish("/a/b", "c2")
    router.pending["c1"] = drained
    router.session_lost("closed with 4502 DRAINED", untaken_failed=True)
    assert drained.result is not None and drained.result.status is Status.PUBLISH_FAILED
    assert drained.result.reason == "not published: closed with 4502 DRAINED"
    router.pending["c2"] = lost
    router.session_lost("connection lost")
    assert lost.result is None and lost.lost == "connection lost"
    assert close_codes.should_reconnect(close_codes.DRAINED.code)


def test_sigterm_drains_a_publishing_client_without_unknown_outcomes(start_server: Any) -> None:
    server = start_server(DrainTime="10")
    outcomes: dict[str, int] = {"ok": 0, "failed": 0, "unknown": 0}
    policy = ReconnectPolicy(initial_delay=0.05, max_delay=0.2, connect_timeout=1.0,
                             max_attempts=3)

    async def publisher(client: Any) -> None:
        for i in range(100_000):
            try:
                result = await client.publish("/drain/single", f"m{i}".encode(), timeout=5)
            except PublishOutcomeUnknown:
                outcomes["unknown"] += 1
                return
            except Exception:  # the server is gone: the client ends
                return
            outcomes["ok" if result.ok else "failed"] += 1
            if not result.ok:
                return

    async def main() -> float:
        async with connect([server.url], reconnect=policy) as client:
            await client.wait_connected()
            async with trio.open_nursery() as nursery:
                for _ in range(4):
                    nursery.start_soon(publisher, client)
                await trio.sleep(0.5)
                started = time.monotonic()
                server.proc.send_signal(signal.SIGTERM)
                await trio.to_thread.run_sync(server.proc.wait, 15)
                nursery.cancel_scope.cancel()
            return time.monotonic() - started

    seconds = trio.run(main)
    assert server.proc.returncode == 0, server.log()
    assert seconds < 5, seconds
    assert outcomes["ok"] > 10 and outcomes["unknown"] == 0, outcomes
    log = server.log()
    assert "drained in" in log and "closing with 4502" in log, log
