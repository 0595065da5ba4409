"""The accept loops of the monitoring listener, the cluster link port and the Workers
sequencer (migratory/server/accept.py), and the client listeners' (app.py, through
``accept.accepted``), while the process has no descriptor left.

In-process (no_descriptors.py), while a connection waits in the listener's backlog;
trio's MockClock jumps over the retries (5 virtual seconds: ~50 accepts that fail with
EMFILE). trio's ``serve_listeners`` logged each at ERROR with its traceback.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any, cast

import pytest
import trio
import trio.testing
from listen_ports import listen_port
from no_descriptors import no_descriptor_left

from cluster.coordination import UNNUMBERED_EPOCH
from cluster.peers import PeerService
from cluster.publishing import ClusterPublishing
from cluster.replica import Replica
from cluster.sequencer import Sequencer
from cluster.stream import CommittedStream
from migratory.config import Config
from migratory.server.hub import Hub
from migratory.server.monitor_listener import serve_monitoring

Start = Callable[[trio.Nursery], Awaitable[tuple[str, int]]]


async def start_monitoring(nursery: trio.Nursery) -> tuple[str, int]:
    ctx = SimpleNamespace(config=Config.defaults())  # /healthz reads only the config
    address: tuple[str, int] = await nursery.start(serve_monitoring, cast(Any, ctx),
                                                   ("127.0.0.1", 0))
    return address


async def start_cluster_link_port(nursery: trio.Nursery) -> tuple[str, int]:
    port = listen_port()  # for PeerService.run's bind: tests/listen_ports.py
    stream = CommittedStream(ClusterPublishing(
        origin="me#1", replica=Replica(Hub(epoch=UNNUMBERED_EPOCH))))
    service = PeerService(name=f"127.0.0.1:{port}", members=frozenset(), password="p" * 16,
                          stream=stream, take_forward=None)
    await nursery.start(service.run, ("127.0.0.1", port))
    return "127.0.0.1", port


async def start_sequencer(nursery: trio.Nursery) -> tuple[str, int]:
    sequencer = Sequencer(Config.defaults(), workers=1, password="p" * 16)
    address: tuple[str, int] = await nursery.start(sequencer.run)
    return address


async def start_client_listener(nursery: trio.Nursery) -> tuple[str, int]:
    from migratory.config import load_config
    from migratory.server.app import Server

    server = Server(load_config(overrides={"Listen": "127.0.0.1:0"}, environ={}))
    addresses: list[tuple[str, int]] = await nursery.start(server.serve)
    return addresses[0]


def accept_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records
            if r.name in ("migratory.accept", "trio.serve_listeners")
            or (r.name == "migratory.server" and r.getMessage().startswith("client listener"))]


@pytest.mark.parametrize(
    "start", [start_monitoring, start_cluster_link_port, start_sequencer, start_client_listener],
    ids=["monitoring", "cluster-link-port", "sequencer", "client-listener"])
def test_no_descriptor_left_is_said_once_without_a_traceback_then_served_again(
    start: Start, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    answers: list[bytes] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            address = await start(nursery)
            # connected without a checkpoint: it waits in the backlog, not yet accepted
            client = trio.socket.from_stdlib_socket(socket.create_connection(address))
            with no_descriptor_left():
                await trio.sleep(5.0)  # virtual: ~50 accepts refused
            with client:
                await client.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                with trio.move_on_after(5):
                    answers.append(await client.recv(4096))
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    lines = accept_lines(caplog)
    assert [r for r in caplog.records if r.exc_info] == []
    assert len(lines) == 2, [r.getMessage()[:80] for r in lines[:3]]
    failed, again = (r.getMessage() for r in lines)
    assert "EMFILE" in failed and "ulimit -n" in failed and "LimitNOFILE" in failed
    assert all(r.levelno == logging.WARNING for r in lines)
    failures = int(again.split(" after ")[1].split()[0])
    assert 40 <= failures <= 60, again  # every 0.1 s for 5 s
    if start in (start_monitoring, start_client_listener):  # served once descriptors were back
        assert answers and answers[0].startswith(b"HTTP/1.1 200"), answers
